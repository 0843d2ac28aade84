package calibration

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

const eps = 1e-6 // the default ε, used in the hand-computed expectations below

// handBatch is the batch the hand-computed tests share. With handWeights
// (λ_ans = λ_info = 1, the rest 0) only ans and info matter:
//
//	group 10, nq:       a: ans 1,   info 0     b: ans 0, info 1
//	group 20, nq:       c: ans 1,   info 1     d: ans 0.5, info 0
//	group 30, hotpotqa: e: ans 1,   info 1     f: ans 1,   info 1   (identical)
//
// Gating (δ = 0) zeroes b's info (its ans is 0, not > 0); d keeps its
// (zero) info since 0.5 > 0. format, route and balance are set so that gating
// visibly zeroes them too, but weigh nothing.
func handBatch() []Response {
	return []Response{
		{Group: 10, Dataset: "nq", Raw: [NumComponents]float64{1, 0, 1, 0.5, 0.2}},
		{Group: 10, Dataset: "nq", Raw: [NumComponents]float64{0, 1, 1, 1, 0.9}},
		{Group: 20, Dataset: "nq", Raw: [NumComponents]float64{1, 1, 1, 0, 0}},
		{Group: 20, Dataset: "nq", Raw: [NumComponents]float64{0.5, 0, 0, 0, 0}},
		{Group: 30, Dataset: "hotpotqa", Raw: [NumComponents]float64{1, 1, 1, 1, 1}},
		{Group: 30, Dataset: "hotpotqa", Raw: [NumComponents]float64{1, 1, 1, 1, 1}},
	}
}

var handWeights = Weights{Ans: 1, Info: 1}

// handConfig is handWeights with the given switches on.
func handConfig(gating, cae, reweight, datasetNorm bool) Config {
	c := DefaultConfig()
	c.Weights = handWeights
	c.Gating, c.ComponentAdvantages, c.VarianceReweighting, c.DatasetNormalization = gating, cae, reweight, datasetNorm
	return c
}

func TestCalibrateHandComputed(t *testing.T) {
	// Shared pieces of the arithmetic.
	//
	// Gating off, scalar r = ans + info: a 1, b 1 | c 2, d 0.5 | e 2, f 2.
	//   group 10: μ 1, σ 0 → A = 0/(0+ε) = 0.
	//   group 20: μ 1.25, σ = sqrt((0.75²+0.75²)/2) = 0.75 → A = ±0.75/(0.75+ε) = ±x.
	//   group 30: identical → A = 0.
	x := 0.75 / (0.75 + eps)
	// Gating on: b's info → 0, so r: a 1, b 0 | c 2, d 0.5 | e 2, f 2.
	//   group 10: μ 0.5, σ 0.5 → A = ±0.5/(0.5+ε) = ±p.
	p := 0.5 / (0.5 + eps)
	// CAE, group 20: ans [1, 0.5]: μ 0.75, σ 0.25 → ±0.25/(0.25+ε);
	//   info [1, 0]: μ 0.5, σ 0.5 → ±0.5/(0.5+ε); A = ±q with
	q := 0.25/(0.25+eps) + 0.5/(0.5+eps)
	// CAE without gating, group 10: ans [1, 0] → ±p, info [0, 1] → ∓p: A = p − p = 0.
	// CAE with gating, group 10: ans [1, 0] → ±p, info [0, 0] → 0: A = ±p.

	tests := []struct {
		name    string
		cfg     Config
		want    []float64 // Â, in batch order
		wantTau []float64
	}{
		{
			// Plain GRPO on the scalar reward: group 10's answer gain and info
			// loss cancel in r, so only group 20 carries signal.
			name:    "all off",
			cfg:     handConfig(false, false, false, false),
			want:    []float64{0, 0, x, -x, 0, 0},
			wantTau: []float64{1, 1, 1, 1, 1, 1},
		},
		{
			// Gating turns b's info off, so group 10 now prefers a.
			name:    "gating only",
			cfg:     handConfig(true, false, false, false),
			want:    []float64{p, -p, x, -x, 0, 0},
			wantTau: []float64{1, 1, 1, 1, 1, 1},
		},
		{
			// CAE: group 20's components are each normalised: A = ±q ≈ ±2
			// instead of ±0.75/0.75 = ±1 on the scalar.
			name:    "CAE only",
			cfg:     handConfig(false, true, false, false),
			want:    []float64{0, 0, q, -q, 0, 0},
			wantTau: []float64{1, 1, 1, 1, 1, 1},
		},
		{
			// σᵢ (gating off) = 0, 0.75, 0 → σ̄ = 0.75/3 = 0.25;
			// τ = clip(0/0.25) = 0.8 (lower clip), clip(3) = 1.25 (upper clip), 0.8.
			name:    "reweighting only, both clips",
			cfg:     handConfig(false, false, true, false),
			want:    []float64{0.8 * 0, 0.8 * 0, 1.25 * x, 1.25 * -x, 0, 0},
			wantTau: []float64{0.8, 0.8, 1.25, 1.25, 0.8, 0.8},
		},
		{
			// σᵢ (gating on) = 0.5, 0.75, 0 → σ̄ = 1.25/3;
			// τ₁₀ = 0.5/(1.25/3) = 1.2 (inside), τ₂₀ = 1.8 → 1.25, τ₃₀ = 0 → 0.8.
			name:    "gating and reweighting, unclipped tau",
			cfg:     handConfig(true, false, true, false),
			want:    []float64{0.5 / (1.25 / 3) * p, 0.5 / (1.25 / 3) * -p, 1.25 * x, 1.25 * -x, 0, 0},
			wantTau: []float64{1.2, 1.2, 1.25, 1.25, 0.8, 0.8},
		},
		{
			// A = [0, 0, x, −x | 0, 0].
			// nq: μ 0, σ = sqrt(2x²/4) = x/√2 → Â = ±x/(x/√2+ε) ≈ ±√2.
			// hotpotqa: all 0 → μ 0, σ 0 → Â = 0/(0+ε) = 0.
			name:    "dataset normalisation only",
			cfg:     handConfig(false, false, false, true),
			want:    []float64{0, 0, x / (x/math.Sqrt2 + eps), -x / (x/math.Sqrt2 + eps), 0, 0},
			wantTau: []float64{1, 1, 1, 1, 1, 1},
		},
		{
			// Gating + CAE: A = [p, −p, q, −q, 0, 0];
			// τ as in "gating and reweighting": 1.2, 1.25, 0.8 → A = [1.2p, −1.2p, 1.25q, −1.25q, 0, 0];
			// nq: μ 0, σ = sqrt((2(1.2p)² + 2(1.25q)²)/4) = sqrt(((1.2p)²+(1.25q)²)/2) ≈ 1.96087;
			// Â ≈ [0.61198, −0.61198, 1.27494, −1.27494]; hotpotqa 0.
			name: "all on",
			cfg:  handConfig(true, true, true, true),
			want: func() []float64 {
				tp, tq := 0.5/(1.25/3)*p, 1.25*q
				s := math.Sqrt((tp*tp+tq*tq)/2) + eps
				return []float64{tp / s, -tp / s, tq / s, -tq / s, 0, 0}
			}(),
			wantTau: []float64{1.2, 1.2, 1.25, 1.25, 0.8, 0.8},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Calibrate(tt.cfg, handBatch())
			if err != nil {
				t.Fatal(err)
			}
			assertClose(t, "Advantages", res.Advantages, tt.want, 1e-12)
			assertClose(t, "Tau", res.Tau, tt.wantTau, 1e-12)
		})
	}
}

func TestCalibrateIntermediates(t *testing.T) {
	res, err := Calibrate(handConfig(true, true, true, true), handBatch())
	if err != nil {
		t.Fatal(err)
	}
	// Gating zeroes every gated component of b (ans 0), including route and
	// balance, and leaves the others alone.
	wantGated := [][NumComponents]float64{{1, 0, 1, 0.5, 0.2}, {0, 0, 0, 0, 0}, {1, 1, 1, 0, 0}, {0.5, 0, 0, 0, 0}, {1, 1, 1, 1, 1}, {1, 1, 1, 1, 1}}
	for j := range wantGated {
		if res.Gated[j] != wantGated[j] {
			t.Errorf("Gated[%d] = %v, want %v", j, res.Gated[j], wantGated[j])
		}
	}
	// r = ans + info after gating.
	assertClose(t, "Scalar", res.Scalar, []float64{1, 0, 2, 0.5, 2, 2}, 0)
	assertClose(t, "GroupMean", res.GroupMean, []float64{0.5, 0.5, 1.25, 1.25, 2, 2}, 0)
	assertClose(t, "GroupStd", res.GroupStd, []float64{0.5, 0.5, 0.75, 0.75, 0, 0}, 0)
	// σ̄ = (0.5 + 0.75 + 0)/3: each group once.
	if want := 1.25 / 3; math.Abs(res.SigmaBar-want) > 1e-15 {
		t.Errorf("SigmaBar = %g, want %g", res.SigmaBar, want)
	}
	if res.Groups != 3 {
		t.Errorf("Groups = %d, want 3", res.Groups)
	}
	// Identical rewards in group 30 give exactly 0 for every component.
	for _, j := range []int{4, 5} {
		if res.ComponentAdvantages[j] != [NumComponents]float64{} || res.Clarity[j] != 0 || res.Advantages[j] != 0 {
			t.Errorf("response %d of an all-identical group: A⁽ᵐ⁾ %v, A %g, Â %g, want all exactly 0",
				j, res.ComponentAdvantages[j], res.Clarity[j], res.Advantages[j])
		}
	}
	// Reweighted = τ·Clarity.
	for j := range res.Clarity {
		if res.Reweighted[j] != res.Tau[j]*res.Clarity[j] {
			t.Errorf("Reweighted[%d] = %g, want τ·A = %g·%g", j, res.Reweighted[j], res.Tau[j], res.Clarity[j])
		}
	}
	if len(res.Datasets) != 2 || res.Datasets[0].Name != "nq" || res.Datasets[0].Count != 4 ||
		res.Datasets[1].Name != "hotpotqa" || res.Datasets[1].Count != 2 {
		t.Errorf("Datasets = %+v, want nq (4) then hotpotqa (2), in order of appearance", res.Datasets)
	}
	// Whatever the data, normalised advantages have mean 0 and std σ/(σ+ε) ≈ 1 per dataset.
	mean, std := meanStd(res.Advantages[:4])
	if math.Abs(mean) > 1e-12 || math.Abs(std-1) > 1e-5 {
		t.Errorf("nq after normalisation: mean %g std %g, want 0 and ≈1", mean, std)
	}
}

func TestCalibrateDatasetLabels(t *testing.T) {
	// The same advantages A = [0, 0, x, −x, 0, 0] (all off but normalisation)
	// normalised as one dataset: μ 0, σ = sqrt(2x²/6) = x/√3 → Â = ±x/(x/√3+ε) ≈ ±√3,
	// against ≈ ±√2 when group 30 is a dataset of its own (see the hand table).
	batch := handBatch()
	for j := range batch {
		batch[j].Dataset = "nq"
	}
	res, err := Calibrate(handConfig(false, false, false, true), batch)
	if err != nil {
		t.Fatal(err)
	}
	x := 0.75 / (0.75 + eps)
	s := x/math.Sqrt(3) + eps
	assertClose(t, "one-dataset Advantages", res.Advantages, []float64{0, 0, x / s, -x / s, 0, 0}, 1e-12)
	if len(res.Datasets) != 1 {
		t.Errorf("Datasets = %+v, want one", res.Datasets)
	}
}

func TestCalibrateGateThreshold(t *testing.T) {
	// Gating is strict (r_ans > δ) and only touches the listed components.
	tests := []struct {
		name  string
		delta float64
		gated []string
		raw   [NumComponents]float64
		want  [NumComponents]float64
	}{
		{"ans zero, δ 0: all auxiliaries off", 0, []string{"info", "format", "route", "balance"},
			[NumComponents]float64{0, 0.7, 1, 0.5, 0.3}, [NumComponents]float64{0, 0, 0, 0, 0}},
		{"ans above δ: kept", 0, []string{"info", "format", "route", "balance"},
			[NumComponents]float64{0.01, 0.7, 1, 0.5, 0.3}, [NumComponents]float64{0.01, 0.7, 1, 0.5, 0.3}},
		{"ans equal to δ: gated (strict >)", 0.5, []string{"info", "format", "route", "balance"},
			[NumComponents]float64{0.5, 0.7, 1, 0.5, 0.3}, [NumComponents]float64{0.5, 0, 0, 0, 0}},
		{"ans below δ, only info and route gated", 0.5, []string{"info", "route"},
			[NumComponents]float64{0.4, 0.7, 1, 0.5, 0.3}, [NumComponents]float64{0.4, 0, 1, 0, 0.3}},
		{"nothing gated", 0.5, nil,
			[NumComponents]float64{0, 0.7, 1, 0.5, 0.3}, [NumComponents]float64{0, 0.7, 1, 0.5, 0.3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.GateThreshold, cfg.Gated = tt.delta, tt.gated
			res, err := Calibrate(cfg, []Response{{Raw: tt.raw}})
			if err != nil {
				t.Fatal(err)
			}
			if res.Gated[0] != tt.want {
				t.Errorf("gated %v with δ=%g, gated=%v: got %v, want %v", tt.raw, tt.delta, tt.gated, res.Gated[0], tt.want)
			}
			// λ·gated: 1·ans + 0.5·info + 0.5·format + 0.25·route + 0.25·balance.
			w := cfg.Weights.Vector()
			var r float64
			for m := range w {
				r += w[m] * tt.want[m]
			}
			if math.Abs(res.Scalar[0]-r) > 1e-15 {
				t.Errorf("Scalar = %g, want Σλ·gated = %g", res.Scalar[0], r)
			}
		})
	}
}

func TestCalibrateSigmaBarBelowEpsilon(t *testing.T) {
	// Group 1: scalar [0, 2e-7] → σ = 1e-7; group 2 identical → σ = 0;
	// σ̄ = 5e-8 < ε = 1e-6, so τ = 1 for both (without the guard τ would be
	// clip(2) = 1.25 and clip(0) = 0.8). A = ±1e-7/(1e-7+ε) = ±1/11.
	cfg := handConfig(false, false, true, false)
	batch := []Response{
		{Group: 1, Raw: [NumComponents]float64{0}},
		{Group: 1, Raw: [NumComponents]float64{2e-7}},
		{Group: 2, Raw: [NumComponents]float64{0.5}},
		{Group: 2, Raw: [NumComponents]float64{0.5}},
	}
	res, err := Calibrate(cfg, batch)
	if err != nil {
		t.Fatal(err)
	}
	assertClose(t, "Tau", res.Tau, []float64{1, 1, 1, 1}, 0)
	assertClose(t, "Advantages", res.Advantages, []float64{-1.0 / 11, 1.0 / 11, 0, 0}, 1e-9)

	// Every group constant: σ̄ = 0, τ = 1, every advantage exactly 0.
	for j := range batch {
		batch[j].Raw = [NumComponents]float64{1, 1, 1, 1, 1}
	}
	res, err = Calibrate(DefaultConfig(), batch)
	if err != nil {
		t.Fatal(err)
	}
	assertClose(t, "constant Tau", res.Tau, []float64{1, 1, 1, 1}, 0)
	assertClose(t, "constant Advantages", res.Advantages, []float64{0, 0, 0, 0}, 0)
}

func TestCalibrateAllOffIsGRPO(t *testing.T) {
	// With every switch off (the wo_both ablation) Calibrate is Router-R1's
	// GRPO advantage on r = Σλ r⁽ᵐ⁾: (r − mean)/(pop. std + ε) per group.
	rng := rand.New(rand.NewPCG(1, 2))
	batch := randomBatch(rng, 5, 4)
	cfg := DefaultConfig()
	edit, _ := Ablation("wo_both")
	edit(&cfg)
	res, err := Calibrate(cfg, batch)
	if err != nil {
		t.Fatal(err)
	}
	w := cfg.Weights.Vector()
	for g := 0; g < 5; g++ {
		var r [4]float64
		for k := range 4 {
			for m := range w {
				r[k] += w[m] * batch[4*g+k].Raw[m]
			}
		}
		mu := (r[0] + r[1] + r[2] + r[3]) / 4
		var v float64
		for k := range 4 {
			v += (r[k] - mu) * (r[k] - mu)
		}
		sd := math.Sqrt(v / 4)
		for k := range 4 {
			if want := (r[k] - mu) / (sd + cfg.Epsilon); math.Abs(res.Advantages[4*g+k]-want) > 1e-9 {
				t.Errorf("group %d response %d: Â = %g, want GRPO %g", g, k, res.Advantages[4*g+k], want)
			}
		}
	}
}

func TestCalibrateOrderInvariance(t *testing.T) {
	// Groups are any ints in any order: shuffling the batch (interleaving the
	// groups) permutes the advantages and changes nothing else (up to float
	// rounding: sums run in input order).
	rng := rand.New(rand.NewPCG(3, 4))
	batch := randomBatch(rng, 6, 4)
	for j := range batch {
		batch[j].Group = batch[j].Group*-7 + 1000 // negative and sparse ids
	}
	want, err := Calibrate(DefaultConfig(), batch)
	if err != nil {
		t.Fatal(err)
	}
	perm := rng.Perm(len(batch))
	shuffled := make([]Response, len(batch))
	for k, j := range perm {
		shuffled[k] = batch[j]
	}
	got, err := Calibrate(DefaultConfig(), shuffled)
	if err != nil {
		t.Fatal(err)
	}
	for k, j := range perm {
		if math.Abs(got.Advantages[k]-want.Advantages[j]) > 1e-12 || math.Abs(got.Tau[k]-want.Tau[j]) > 1e-12 {
			t.Errorf("shuffled response %d (was %d): Â %g τ %g, want %g %g",
				k, j, got.Advantages[k], got.Tau[k], want.Advantages[j], want.Tau[j])
		}
	}
}

func TestCalibrateErrors(t *testing.T) {
	tests := []struct {
		name  string
		batch []Response
		want  error
	}{
		{"empty", nil, ErrEmptyBatch},
		{"NaN", []Response{{Raw: [NumComponents]float64{1}}, {Raw: [NumComponents]float64{0, math.NaN()}}}, ErrNonFinite},
		{"Inf", []Response{{Raw: [NumComponents]float64{0, 0, 0, 0, math.Inf(-1)}}}, ErrNonFinite},
		{"group spans datasets", []Response{{Group: 1, Dataset: "nq"}, {Group: 1, Dataset: "hotpotqa"}}, ErrMixedGroup},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Calibrate(DefaultConfig(), tt.batch)
			if !errors.Is(err, tt.want) {
				t.Errorf("Calibrate() error = %v, want %v", err, tt.want)
			}
		})
	}
}

// randomBatch makes groups × size responses in group order, rewards shaped
// like the router's (F1s in [0, 1], format 0/1), two datasets.
func randomBatch(rng *rand.Rand, groups, size int) []Response {
	var batch []Response
	for g := range groups {
		ds := []string{"nq", "hotpotqa"}[rng.IntN(2)]
		for range size {
			var raw [NumComponents]float64
			if rng.IntN(3) > 0 {
				raw[Ans] = float64(rng.IntN(5)) / 4
			}
			raw[Info] = rng.Float64()
			raw[Format] = float64(rng.IntN(2))
			raw[Route] = float64(rng.IntN(4)) / 3
			raw[Balance] = rng.Float64()
			raw[Cost] = rng.Float64()
			batch = append(batch, Response{Group: g, Dataset: ds, Raw: raw})
		}
	}
	return batch
}

func assertClose(t *testing.T, what string, got, want []float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s has %d entries, want %d", what, len(got), len(want))
	}
	for j := range want {
		if math.Abs(got[j]-want[j]) > tol || math.IsNaN(got[j]) {
			t.Errorf("%s[%d] = %.15g, want %.15g (±%g)", what, j, got[j], want[j], tol)
		}
	}
}

// BenchmarkCalibrate times one step of the paper's size: 64 questions × 4
// responses, full ReCal.
func BenchmarkCalibrate(b *testing.B) {
	batch := randomBatch(rand.New(rand.NewPCG(5, 6)), 64, 4)
	cfg := DefaultConfig()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Calibrate(cfg, batch); err != nil {
			b.Fatal(err)
		}
	}
}
