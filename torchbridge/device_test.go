package torchbridge_test

import (
	"context"
	"fmt"
	"math"
	"math/rand"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/internal/testing/ranktest"
	"github.com/recal-project/recal/torchbridge"
)

// The tests' policies live on the device RECAL_TEST_DEVICE names ("cuda",
// "cuda:1"), else on the CPU. Where it names a GPU and the linked libtorch
// has no CUDA or sees no GPU (CI, the development machines), the tests run
// on the CPU as usual and the device-only tests skip. The data-parallel
// tests (dist_test.go) stay on the CPU: their ranks share one machine.
var testDevice = func() string {
	d := os.Getenv("RECAL_TEST_DEVICE")
	if d == "" || d == "cpu" {
		return ""
	}
	if strings.HasPrefix(d, "cuda") {
		if ok, _ := torchbridge.CUDAAvailable(); !ok {
			fmt.Fprintf(os.Stderr, "RECAL_TEST_DEVICE=%s: this libtorch has no CUDA or sees no GPU; the tests run on the CPU\n", d)
			return ""
		}
	}
	return d
}()

// onDevice sets o's device to the tests' device unless o names one.
func onDevice(o torchbridge.Options) torchbridge.Options {
	if o.Device == "" {
		o.Device = testDevice
	}
	return o
}

// deviceConfig is a Qwen2 large enough for the GPU's kernels to differ from
// the CPU's (blocked products, split reductions), small enough for the CPU.
func deviceConfig() *hfmodel.Config {
	return &hfmodel.Config{
		Architectures: []string{"Qwen2ForCausalLM"}, ModelType: "qwen2",
		VocabSize: 1024, HiddenSize: 128, IntermediateSize: 352, NumHiddenLayers: 3,
		NumAttentionHeads: 8, NumKeyValueHeads: 2, MaxPositionEmbeddings: 512,
		RopeTheta: 1e6, RMSNormEps: 1e-6, TieWordEmbeddings: true, EOSTokenIDs: []int64{1},
	}
}

// maxRel is max|a−b| / max(max|b|, floor).
func maxRel(a, b []float32, floor float64) float64 {
	var d, m float64
	for i := range a {
		d = math.Max(d, math.Abs(float64(a[i])-float64(b[i])))
		m = math.Max(m, math.Abs(float64(b[i])))
	}
	return d / math.Max(m, floor)
}

// l2Rel is ‖a−b‖ / ‖b‖.
func l2Rel(a, b []float32) float64 {
	var d, n float64
	for i := range a {
		x := float64(a[i]) - float64(b[i])
		d += x * x
		n += float64(b[i]) * float64(b[i])
	}
	if n == 0 {
		return math.Sqrt(d)
	}
	return math.Sqrt(d / n)
}

// The same policy on the device and on the CPU, in float32 and bfloat16:
// log-probabilities, entropies, a GRPO loss with its gradients, one AdamW
// step and greedy decoding agree within each dtype's tolerance. Runs only
// when RECAL_TEST_DEVICE names a device other than the CPU.
func TestDeviceMatchesCPU(t *testing.T) {
	if testDevice == "" {
		t.Skip("RECAL_TEST_DEVICE names no device other than the CPU (or it has none)")
	}
	ctx := context.Background()
	// Tolerances: float32 differs by summation order alone (TF32 is off in
	// libtorch unless asked for); bfloat16 rounds every product's result to 8
	// bits of mantissa, so kernels that sum in another order differ by a few
	// units of 2⁻⁸.
	tols := map[string]struct{ logp, grad, param float64 }{
		"float32":  {logp: 2e-4, grad: 1e-3, param: 1e-3},
		"bfloat16": {logp: 0.15, grad: 0.1, param: 0.1},
	}
	for _, dtype := range []string{"float32", "bfloat16"} {
		t.Run(dtype, func(t *testing.T) {
			tol := tols[dtype]
			mk := func(device string) *torchbridge.Policy {
				p, err := torchbridge.NewPolicy(deviceConfig(), torchbridge.Options{Device: device, DType: dtype})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { p.Close() })
				if err := p.InitRandom(7, 0.05); err != nil { // CPU generator: both get the same weights
					t.Fatal(err)
				}
				return p
			}
			cpu, dev := mk("cpu"), mk(testDevice)
			r := rand.New(rand.NewSource(3))
			var seqs [][]int32
			for i := 0; i < 6; i++ {
				seqs = append(seqs, randomSeq(r, 40+13*i, 1024))
			}
			lpC, entC, err := cpu.Score(ctx, seqs)
			if err != nil {
				t.Fatal(err)
			}
			lpD, entD, err := dev.Score(ctx, seqs)
			if err != nil {
				t.Fatal(err)
			}
			var dlp, dent float64
			for i := range seqs {
				for k := range lpC[i] {
					dlp = math.Max(dlp, math.Abs(float64(lpD[i][k]-lpC[i][k])))
					dent = math.Max(dent, math.Abs(float64(entD[i][k]-entC[i][k])))
				}
			}
			t.Logf("score: max |Δlog p| %.3g, max |Δentropy| %.3g (log p ≈ %.2f)", dlp, dent, lpC[0][1])
			if dlp > tol.logp || dent > tol.logp {
				t.Errorf("score: device and CPU differ by %.3g (log p), %.3g (entropy); tolerance %g", dlp, dent, tol.logp)
			}

			// A GRPO loss with a KL and an entropy term, off-policy.
			batch := make([]torchbridge.Sequence, len(seqs))
			for i, s := range seqs {
				mask := make([]float32, len(s))
				old := make([]float32, len(s))
				ref := make([]float32, len(s))
				for k := range s {
					if k >= len(s)/3 {
						mask[k] = 1
					}
					old[k] = lpC[i][k] + float32(0.05*r.NormFloat64())
					ref[k] = lpC[i][k] + float32(0.05*r.NormFloat64())
				}
				batch[i] = torchbridge.Sequence{Tokens: s, Mask: mask, Advantage: float32(r.NormFloat64()), OldLogp: old, RefLogp: ref}
			}
			opt := torchbridge.LossOptions{ClipEps: 0.2, KLCoef: 0.05, EntropyCoef: 0.01, Scale: 1.0 / 200, HeadChunk: 64}
			stC, err := cpu.Backward(ctx, batch, opt)
			if err != nil {
				t.Fatal(err)
			}
			stD, err := dev.Backward(ctx, batch, opt)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("loss: cpu %.7g, device %.7g; KL cpu %.7g, device %.7g", stC.Loss, stD.Loss, stC.KL, stD.KL)
			if d := math.Abs(stD.Loss - stC.Loss); d > tol.logp*math.Max(1, math.Abs(stC.Loss)) {
				t.Errorf("loss: device %v, CPU %v", stD.Loss, stC.Loss)
			}
			if stD.Tokens != stC.Tokens {
				t.Errorf("tokens: device %v, CPU %v", stD.Tokens, stC.Tokens)
			}
			worst, worstName := 0.0, ""
			for _, pr := range cpu.Params() {
				gC := getF32(t, cpu, "grad/"+pr.Name, pr.Numel())
				gD := getF32(t, dev, "grad/"+pr.Name, pr.Numel())
				if d := l2Rel(gD, gC); d > worst {
					worst, worstName = d, pr.Name
				}
			}
			t.Logf("gradients: worst ‖g_dev − g_cpu‖/‖g_cpu‖ %.3g (%s)", worst, worstName)
			if worst > tol.grad {
				t.Errorf("gradient of %s: relative difference %.3g, tolerance %g", worstName, worst, tol.grad)
			}

			// One AdamW step. Its first update is lr·g/(|g|+eps): with a
			// small eps an element whose gradient is rounding noise (the k
			// bias's is zero in exact arithmetic) moves by ±lr on either
			// device, whichever sign the noise has; eps 1e-3 keeps the
			// update a smooth function of the gradient, so what is compared
			// is the step's arithmetic. bfloat16 policies step their float32
			// master copies ("master/…"), which are compared.
			o := torchbridge.AdamW{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-3, WeightDecay: 0.01, MaxGradNorm: 1}
			weights := func(p *torchbridge.Policy, name string, n int64) []float32 {
				if dtype == "bfloat16" {
					return getF32(t, p, "master/"+name, n)
				}
				return getF32(t, p, name, n)
			}
			before := map[string][]float32{}
			for _, pr := range cpu.Params() {
				before[pr.Name] = getF32(t, cpu, pr.Name, pr.Numel())
			}
			gnC, err := cpu.Step(ctx, o)
			if err != nil {
				t.Fatal(err)
			}
			gnD, err := dev.Step(ctx, o)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("gradient norm: cpu %.7g, device %.7g", gnC, gnD)
			if math.Abs(gnD-gnC) > tol.grad*gnC {
				t.Errorf("gradient norm: device %v, CPU %v", gnD, gnC)
			}
			// ‖w_dev − w_cpu‖ / ‖w_cpu − w_before‖: the two updates' difference
			// relative to the update (a floor of 1e-6 per element for
			// parameters that hardly move).
			pworst, pname := 0.0, ""
			for _, pr := range cpu.Params() {
				wC, wD, w0 := weights(cpu, pr.Name, pr.Numel()), weights(dev, pr.Name, pr.Numel()), before[pr.Name]
				var d, u float64
				for i := range wC {
					d += math.Pow(float64(wD[i])-float64(wC[i]), 2)
					u += math.Pow(float64(wC[i])-float64(w0[i]), 2)
				}
				if r := math.Sqrt(d) / (math.Sqrt(u) + 1e-6*math.Sqrt(float64(len(wC)))); r > pworst {
					pworst, pname = r, pr.Name
				}
			}
			t.Logf("after one AdamW step: worst ‖Δ(update)‖/‖update‖ %.3g (%s)", pworst, pname)
			if pworst > tol.param {
				t.Errorf("weights after a step (%s): the updates differ by %.3g of their size, tolerance %g", pname, pworst, tol.param)
			}

			// Greedy decoding of 4 rows, 24 tokens, in the KV cache.
			decode := func(p *torchbridge.Policy) ([][]int32, [][]float32) {
				c, err := p.NewCache(4, 128)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				st := torchbridge.Step{WantLogits: true}
				for i := 0; i < 4; i++ {
					st.Rows = append(st.Rows, i)
					st.Tokens = append(st.Tokens, seqs[i][:20+i])
				}
				out := make([][]int32, 4)
				var first [][]float32
				for k := 0; k < 24; k++ {
					res, err := c.Extend(ctx, st)
					if err != nil {
						t.Fatal(err)
					}
					if k == 0 {
						first = res.Logits
						st.WantLogits = false
					}
					for i := range out {
						out[i] = append(out[i], res.Next[i])
						st.Tokens[i] = []int32{res.Next[i]}
					}
				}
				return out, first
			}
			tokC, logC := decode(cpu)
			tokD, logD := decode(dev)
			var dl float64
			for i := range logC {
				dl = math.Max(dl, maxRel(logD[i], logC[i], 1))
			}
			same := 0
			for i := range tokC {
				for k := range tokC[i] {
					if tokC[i][k] != tokD[i][k] {
						break
					}
					same++
				}
			}
			t.Logf("decode: prefill logits max relative difference %.3g; %d of %d greedy tokens agree before the first difference", dl, same, 4*24)
			if dl > tol.logp {
				t.Errorf("prefill logits: relative difference %.3g, tolerance %g", dl, tol.logp)
			}
			if dtype == "float32" && same != 4*24 {
				t.Errorf("greedy decoding differs: device %v, CPU %v", tokD, tokC)
			}
		})
	}
}

// A group of one over NCCL (one GPU is enough): the gradients of a policy on
// the GPU go through NCCL's all-reduce and come back unchanged. Runs only
// when RECAL_TEST_DEVICE names a GPU; skips in builds without NCCL.
func TestDeviceNCCLOneRank(t *testing.T) {
	if !strings.HasPrefix(testDevice, "cuda") {
		t.Skip("RECAL_TEST_DEVICE names no GPU (or there is none)")
	}
	if os.Getenv(helperEnv) != "" {
		t.Skip("inside a helper rank")
	}
	ctx := context.Background()
	g, err := torchbridge.NewProcessGroup(ctx, torchbridge.GroupOptions{WorldSize: 1, MasterPort: ranktest.FreePort(t), Timeout: 30 * time.Second, Backend: "nccl"})
	if err != nil {
		if strings.Contains(err.Error(), "this build has no NCCL") || strings.Contains(err.Error(), "this build has no Gloo") {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	defer g.Close()
	p := newTinyOn(t, testDevice, 64, true, 3)
	if _, _, err := p.BackwardNLL(ctx, [][]int32{{1, 2, 3, 4, 5, 6}}, [][]float32{{0, 1, 1, 1, 1, 1}}, 1, 0); err != nil {
		t.Fatal(err)
	}
	var before [][]float32
	for _, pr := range p.Params() {
		before = append(before, getF32(t, p, "grad/"+pr.Name, pr.Numel()))
	}
	start := time.Now()
	if err := g.AllReduceGrads(ctx, p); err != nil {
		t.Fatal(err)
	}
	t.Logf("NCCL all-reduce of %d gradients over one rank: %v", len(before), time.Since(start))
	for i, pr := range p.Params() {
		if !slicesEqual(before[i], getF32(t, p, "grad/"+pr.Name, pr.Numel())) {
			t.Fatalf("the NCCL all-reduce over one rank changed the gradient of %s", pr.Name)
		}
	}
}

// CUDA-graph decoding against eager decoding (libtorch's kernels launched
// one by one) on the same weights, and both against the training forward
// pass (Score) that recomputes the rollout's log-probs for the loss: greedy
// and sampled steps with bans, every row of the cache (the graph attends
// the cache in place) and a subset in another order (gathered, padded to a
// power of two), 80 steps that cross the 64- and 128-column buckets. Runs
// only when RECAL_TEST_DEVICE names a GPU.
func TestDeviceGraphDecode(t *testing.T) {
	if !strings.HasPrefix(testDevice, "cuda") {
		t.Skip("RECAL_TEST_DEVICE names no GPU (or there is none)")
	}
	ctx := context.Background()
	// float32: the graph runs the eager step's kernels, so tokens agree and
	// log-probs within 1e-5; the training forward sums attention in
	// another order (a causal kernel): within TestCacheMatchesFullForward's
	// 1e-4. bfloat16 rounds each product to 8 bits of mantissa: log-probs
	// within TestDeviceMatchesCPU's 0.15 before the first differing token.
	tols := map[string]struct{ eager, score float64 }{"float32": {1e-5, 1e-4}, "bfloat16": {0.15, 0.15}}
	const steps = 80
	for _, dtype := range []string{"float32", "bfloat16"} {
		t.Run(dtype, func(t *testing.T) {
			tol := tols[dtype]
			p, err := torchbridge.NewPolicy(deviceConfig(), torchbridge.Options{Device: testDevice, DType: dtype})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if err := p.InitRandom(7, 0.05); err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewSource(5))
			prompts := make([][]int32, 6)
			for i := range prompts {
				prompts[i] = randomSeq(r, 20+9*i, 1024)
			}
			type out struct {
				toks [][]int32
				logp [][]float32
			}
			run := func(graphs bool, rows []int, sample string) out {
				t.Helper()
				if err := p.SetCUDAGraphs(graphs); err != nil {
					t.Fatal(err)
				}
				c, err := p.NewCache(6, 200)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				st := torchbridge.Step{Rows: rows, WantLogp: true, Seed: 11}
				switch sample {
				case "bans":
					st.Sampling = torchbridge.Sampling{Temperature: 1, TopP: 0.9}
				case "plain": // drawn inside the graph (KernelGraphSample)
					st.Sampling = torchbridge.Sampling{Temperature: 1, TopP: 1}
				}
				for _, row := range rows {
					st.Tokens = append(st.Tokens, prompts[row]) // the prefill: eager (several tokens a row)
				}
				o := out{toks: make([][]int32, len(rows)), logp: make([][]float32, len(rows))}
				for k := 0; k < steps; k++ {
					if sample == "bans" {
						st.Ban = make([][]int32, len(rows))
						for j := range rows {
							st.Ban[j] = []int32{int32((k*7 + j) % 1024), int32((k*13 + 5*j) % 1024)}
						}
					}
					res, err := c.Extend(ctx, st)
					if err != nil {
						t.Fatal(err)
					}
					for j := range rows {
						o.toks[j] = append(o.toks[j], res.Next[j])
						o.logp[j] = append(o.logp[j], res.Logp[j])
						st.Tokens[j] = []int32{res.Next[j]}
					}
				}
				return o
			}
			for _, tc := range []struct {
				name   string
				rows   []int
				sample string
			}{
				{"all rows, greedy", []int{0, 1, 2, 3, 4, 5}, ""},
				{"subset, greedy", []int{5, 1, 3}, ""},
				{"subset, sampled with bans", []int{4, 0, 2, 3, 5}, "bans"},
				{"all rows, sampled at temperature 1", []int{0, 1, 2, 3, 4, 5}, "plain"},
				{"subset, sampled at temperature 1", []int{3, 0, 5}, "plain"},
			} {
				before, err := p.GraphStats()
				if err != nil {
					t.Fatal(err)
				}
				eager := run(false, tc.rows, tc.sample)
				graph := run(true, tc.rows, tc.sample)
				after, err := p.GraphStats()
				if err != nil {
					t.Fatal(err)
				}
				if after.Error != "" {
					t.Fatalf("%s: %s", tc.name, after.Error)
				}
				// The first step extends by the prompts (eager); the other
				// steps-1 extend by one token each: graph replays.
				if got := after.Replays - before.Replays; got != steps-1 {
					t.Errorf("%s: %d graph replays, want %d", tc.name, got, steps-1)
				}
				if after.Captures == before.Captures {
					t.Errorf("%s: no graph was captured (a new cache captures its own)", tc.name)
				}
				same, total, worst := 0, 0, 0.0
				for j := range tc.rows {
					for k := range eager.toks[j] {
						if eager.toks[j][k] != graph.toks[j][k] {
							break
						}
						same++
						worst = math.Max(worst, math.Abs(float64(eager.logp[j][k]-graph.logp[j][k])))
					}
					total += len(eager.toks[j])
				}
				t.Logf("%s: %d of %d tokens agree before a row's first difference; log-probs within %.3g; graphs captured %d, replayed %d",
					tc.name, same, total, worst, after.Captures, after.Replays)
				if dtype == "float32" && same != total {
					t.Errorf("%s: graph decoding chose other tokens than eager decoding: graph %v, eager %v", tc.name, graph.toks, eager.toks)
				}
				if worst > tol.eager {
					t.Errorf("%s: log-probs differ from eager decoding by %.3g, tolerance %g", tc.name, worst, tol.eager)
				}
				// The training forward over prompt+generation gives the
				// generated tokens' log-probs the loss uses.
				seqs := make([][]int32, len(tc.rows))
				for j, row := range tc.rows {
					seqs[j] = append(append([]int32{}, prompts[row]...), graph.toks[j]...)
				}
				lp, _, err := p.Score(ctx, seqs)
				if err != nil {
					t.Fatal(err)
				}
				var dmax float64
				for j, row := range tc.rows {
					n := len(prompts[row])
					for k := 0; k+1 < len(graph.toks[j]); k++ {
						// lp[j][t] is the log-prob of seqs[j][t]; the k-th generated token sits at n+k.
						dmax = math.Max(dmax, math.Abs(float64(lp[j][n+k]-graph.logp[j][k])))
					}
				}
				t.Logf("%s: rollout log-probs against the training forward: within %.3g", tc.name, dmax)
				if dmax > tol.score {
					t.Errorf("%s: graph decoding's log-probs differ from the training forward's by %.3g, tolerance %g", tc.name, dmax, tol.score)
				}
			}
		})
	}
}

// CUDA graphs off and on, and the allocator's counters, where there is no
// GPU (every test run): a no-op, zero counts, and a clear refusal.
func TestGraphSettingsWithoutGPU(t *testing.T) {
	if testDevice != "" {
		t.Skip("the tests run on a device")
	}
	p, err := torchbridge.NewPolicy(deviceConfig(), torchbridge.Options{EagerDecode: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.SetCUDAGraphs(true); err != nil {
		t.Fatal(err)
	}
	c, err := p.NewCache(2, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st := torchbridge.Step{Rows: []int{0, 1}, Tokens: [][]int32{{1, 2, 3}, {4, 5}}}
	for k := 0; k < 3; k++ {
		res, err := c.Extend(context.Background(), st)
		if err != nil {
			t.Fatal(err)
		}
		st.Tokens = [][]int32{{res.Next[0]}, {res.Next[1]}}
	}
	gs, err := p.GraphStats()
	if err != nil {
		t.Fatal(err)
	}
	if gs != (torchbridge.GraphStats{}) {
		t.Errorf("CPU decoding reported CUDA graphs: %+v", gs)
	}
	if _, err := torchbridge.DeviceMemory("no-such-device:x", true); err == nil {
		t.Error("DeviceMemory of a malformed device name succeeded")
	}
	for _, dev := range []string{"cpu", "cuda"} {
		_, err := torchbridge.DeviceMemory(dev, false)
		if err == nil {
			ok, _ := torchbridge.CUDAAvailable()
			if dev == "cuda" && ok {
				continue
			}
			t.Errorf("DeviceMemory(%q) succeeded without a GPU", dev)
		} else if !strings.Contains(err.Error(), "device memory") {
			t.Errorf("DeviceMemory(%q): %v: want an error that names device memory", dev, err)
		}
	}
}
