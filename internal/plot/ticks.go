package plot

import (
	"math"
	"strconv"

	gplot "gonum.org/v1/plot"
)

// niceTicks labels about want round values (steps of 1, 2, 2.5 or 5 times a
// power of ten) with an unlabelled minor tick between each pair. gonum's
// default ticker labels only two or three values on most of these axes,
// too few to read a curve off.
type niceTicks struct{ want int }

// Ticks implements gplot.Ticker.
func (n niceTicks) Ticks(lo, hi float64) []gplot.Tick {
	if !(hi > lo) || math.IsInf(hi-lo, 0) {
		return gplot.DefaultTicks{}.Ticks(lo, hi)
	}
	raw := (hi - lo) / float64(max(n.want, 1))
	pow := math.Pow(10, math.Floor(math.Log10(raw)))
	step, decimals := 10*pow, -math.Log10(pow)-1
	for _, m := range []float64{1, 2, 2.5, 5} {
		if m*pow >= raw {
			step, decimals = m*pow, -math.Log10(pow)
			if m == 2.5 {
				decimals++
			}
			break
		}
	}
	prec := max(0, int(math.Round(decimals)))
	half := step / 2
	first, last := math.Ceil(lo/half), math.Floor(hi/half+1e-9)
	if !(last-first < 1000) { // range too narrow for float steps: gonum's ticks are as good
		return gplot.DefaultTicks{}.Ticks(lo, hi)
	}
	var ticks []gplot.Tick
	for k := 0; k <= int(last-first); k++ {
		i := first + float64(k)
		v := i * half
		label := ""
		if math.Mod(i, 2) == 0 {
			label = strconv.FormatFloat(v, 'f', prec, 64)
			if label == "-"+strconv.FormatFloat(0, 'f', prec, 64) {
				label = label[1:]
			}
		}
		ticks = append(ticks, gplot.Tick{Value: v, Label: label})
	}
	return ticks
}
