package calibration

import "math"

// meanStd returns the mean and the population standard deviation
// sqrt(Σ(x−μ)²/n) of xs, summing in slice order. Explicit float64
// conversions keep the compiler from fusing multiply-adds, so the results are
// bit-for-bit those of testdata/reference.py, which sums in the same order.
// An empty slice gives (0, 0).
func meanStd(xs []float64) (mean, std float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	n := float64(len(xs))
	var sum float64
	for _, x := range xs {
		sum += x
	}
	mean = sum / n
	var ss float64
	for _, x := range xs {
		d := x - mean
		ss += float64(d * d)
	}
	return mean, math.Sqrt(ss / n)
}

// clip limits x to [lo, hi].
func clip(x, lo, hi float64) float64 {
	return math.Min(math.Max(x, lo), hi)
}
