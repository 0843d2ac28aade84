package trainer

import (
	"encoding/json"
	"math"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/router"
	"github.com/recal-project/recal/torchbridge"
)

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

// GAE against hand-computed values (docs/method.md, 14.3).
func TestGAEHandComputed(t *testing.T) {
	cases := []struct {
		name             string
		in               []gaeInput
		beta, gamma, lam float64
		whiten           bool
		adv, ret         [][]float64
	}{
		{"γ = λ = 1: A = score − V", []gaeInput{{score: 1, values: []float32{0.5, 0.25, -0.125}}}, 0, 1, 1, false,
			[][]float64{{0.5, 0.75, 1.125}}, [][]float64{{1, 1, 1}}},
		// δ3 = 1 + 0 + 0.125 = 1.125; δ2 = 0.9·(−0.125) − 0.25 = −0.3625,
		// A2 = −0.3625 + 0.45·1.125 = 0.14375; δ1 = 0.9·0.25 − 0.5 = −0.275,
		// A1 = −0.275 + 0.45·0.14375 = −0.2103125.
		{"γ = 0.9, λ = 0.5", []gaeInput{{score: 1, values: []float32{0.5, 0.25, -0.125}}}, 0, 0.9, 0.5, false,
			[][]float64{{-0.2103125, 0.14375, 1.125}}, [][]float64{{0.2896875, 0.39375, 1}}},
		// r = −0.5·kl + [last]·score = (−0.125, 0.25, 1): A = suffix sums.
		{"in-reward KL", []gaeInput{{score: 1, values: []float32{0, 0, 0}, kl: []float32{0.25, -0.5, 0}}}, 0.5, 1, 1, false,
			[][]float64{{1.125, 1.25, 1}}, [][]float64{{1.125, 1.25, 1}}},
		// Raw A = (1, 2) and (3): μ = 2, unbiased σ² = 1.
		{"whitening over the batch", []gaeInput{{score: 2, values: []float32{1, 0}}, {score: 3, values: []float32{0}}}, 0, 1, 1, true,
			[][]float64{{-1 / math.Sqrt(1+1e-8), 0}, {1 / math.Sqrt(1+1e-8)}}, [][]float64{{2, 2}, {3}}},
		{"one token whitens to 0", []gaeInput{{score: -1, values: []float32{0.5}}}, 0, 1, 1, true,
			[][]float64{{0}}, [][]float64{{-1}}},
		{"a response without policy tokens", []gaeInput{{score: 1, values: []float32{}}, {score: 0, values: []float32{0.5}}}, 0, 1, 1, false,
			[][]float64{{}, {-0.5}}, [][]float64{{}, {0}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			adv, ret := gae(c.in, c.beta, c.gamma, c.lam, c.whiten)
			for i := range c.adv {
				if len(adv[i]) != len(c.adv[i]) {
					t.Fatalf("response %d: %d advantages, want %d", i, len(adv[i]), len(c.adv[i]))
				}
				for k := range c.adv[i] {
					if !near(adv[i][k], c.adv[i][k], 1e-12) || !near(ret[i][k], c.ret[i][k], 1e-12) {
						t.Errorf("response %d token %d: A %v R %v, want A %v R %v", i, k, adv[i][k], ret[i][k], c.adv[i][k], c.ret[i][k])
					}
				}
			}
		})
	}
}

// Router-R1's outcome reward (docs/method.md, 14.2).
func TestRouterR1Score(t *testing.T) {
	cases := []struct {
		name         string
		r            router.Rewards
		outcome      string
		alpha, cheap float64
		want         float64
	}{
		{"malformed", router.Rewards{Format: 0, Ans: 1, EM: 1}, "f1", 0, 0.5, -1},
		{"wrong answer", router.Rewards{Format: 1, Ans: 0}, "f1", 0.5, 1, 0},
		{"F1", router.Rewards{Format: 1, Ans: 0.5}, "f1", 0, 0.5, 0.5},
		{"F1 with cost", router.Rewards{Format: 1, Ans: 0.5}, "f1", 0.4, 0.25, 0.6*0.5 + 0.4*0.25},
		{"EM", router.Rewards{Format: 1, Ans: 0.5, EM: 1}, "em", 0.4, 0.25, 0.6 + 0.4*0.25},
		{"EM wrong, F1 partial", router.Rewards{Format: 1, Ans: 0.5, EM: 0}, "em", 0.4, 1, 0},
	}
	for _, c := range cases {
		if got := routerR1Score(c.r, c.outcome, c.alpha, c.cheap); !near(got, c.want, 1e-15) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// The cost window and its percentiles (docs/method.md, 14.2).
func TestCheapness(t *testing.T) {
	cases := []struct {
		name   string
		window []float64
		cost   float64
		size   int
		want   float64
		after  []float64
	}{
		{"first response", nil, 4, 10, 0.5, []float64{2}},
		{"all equal", []float64{1, 1, 1}, 1, 10, 0.5, []float64{1, 1, 1, 1}},
		{"most expensive", []float64{0, 1, 2, 3}, 16, 10, 0, []float64{0, 1, 2, 3, 4}},
		{"free", []float64{0, 1, 2, 3}, 0, 10, 1, []float64{0, 1, 2, 3, 0}},
		// Window (1, 2, 3, 4, 2) sorted (1, 2, 2, 3, 4): p5 = 1.2, p95 = 3.8.
		{"inside, the oldest dropped", []float64{0, 1, 2, 3, 4}, 4, 5, 1 - 0.8/2.6, []float64{1, 2, 3, 4, 2}},
	}
	for _, c := range cases {
		w, got := cheapness(c.window, c.cost, c.size)
		if !near(got, c.want, 1e-12) || !slices.Equal(w, c.after) {
			t.Errorf("%s: c = %v, window %v; want %v, %v", c.name, got, w, c.want, c.after)
		}
	}
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// python3 with tomllib (3.11+) for the reference script, or skip.
func python(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(p, "-c", "import tomllib").Run() == nil {
			return p
		}
	}
	t.Skip("no python3 with tomllib (3.11+): cannot run testdata/gae_reference.py")
	return ""
}

var maxDiff = regexp.MustCompile(`max \|recomputed - logged\| = (\S+)`)

// checkGAEReference runs gae_reference.py check on a run folder and returns
// its exit status, the maximum difference it reports and its output.
func checkGAEReference(t *testing.T, dir string) (int, float64, string) {
	t.Helper()
	out, err := exec.Command(python(t), filepath.Join("testdata", "gae_reference.py"), "check", dir).CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	d := math.NaN()
	if m := maxDiff.FindSubmatch(out); m != nil {
		d, _ = strconv.ParseFloat(string(m[1]), 64)
	}
	return code, d, string(out)
}

// PPO's in-reward KL is weighed by ppo.kl_coef (Router-R1's 0.001 by
// default), not by train.kl_coef, GRPO's weight of the KL in its loss: with
// γ = λ = 1, no whitening and zero values, a response's first advantage is
// its score minus β times the sum of its tokens' KL terms. The reference
// policy is kept when that β is > 0.
func TestPPOKLCoefIsItsOwn(t *testing.T) {
	cases := []struct {
		name    string
		sets    []string
		beta    float64 // the β the advantages must show
		keepRef bool    // whether a run keeps the KL reference
	}{
		{"ppo.kl_coef, not train.kl_coef", []string{"train.kl_coef=0.5", "ppo.kl_coef=0.01"}, 0.01, true},
		{"ppo.kl_coef = 0: no KL, whatever train.kl_coef", []string{"train.kl_coef=0.5", "ppo.kl_coef=0"}, 0, false},
		{"train.kl_coef = 0 leaves PPO's", []string{"train.kl_coef=0", "ppo.kl_coef=0.2"}, 0.2, true},
		{"Router-R1's default", []string{"train.kl_coef=0.5"}, 0.001, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := config.Load("../recal.toml", append([]string{"train.algorithm=ppo", "ppo.whiten_advantages=false",
				"ppo.gamma=1", "ppo.lam=1", "ppo.cost_coef=0"}, c.sets...))
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.KLCoef() > 0; got != c.keepRef {
				t.Errorf("Config.KLCoef() = %g: a run keeps the reference %v, want %v", cfg.KLCoef(), got, c.keepRef)
			}
			// Three policy tokens after the prompt token, each with
			// log π_old − log π_ref = 1; a well-formed right answer (score 1).
			s := torchbridge.Sequence{Tokens: make([]int32, 4), Mask: []float32{0, 1, 1, 1},
				OldLogp: []float32{0, -1, -1, -1}, RefLogp: []float32{0, -2, -2, -2}, OldValues: make([]float32, 4)}
			b := &stepBatch{qs: []data.Example{{ID: "nq/1", Dataset: "nq"}}, g: 1, st: &State{},
				seqs: []torchbridge.Sequence{s}, rewards: []router.Rewards{{Format: 1, Ans: 1, EM: 1}}, samples: []router.Sample{{}}}
			newPPO(cfg.Training()).(ppo).fill(b)
			want := 1 - 3*c.beta
			if got := float64(b.ppo[0].Advantages[0]); !near(got, want, 1e-6) {
				t.Errorf("first advantage %g, want 1 − 3·β = %g with β = %g: the in-reward KL must use ppo.kl_coef", got, want, c.beta)
			}
		})
	}
}

// PPO's advantages on synthetic batches with every branch of the reward
// (malformed, wrong, right; EM and F1; a cost term and a window that fills
// and slides across steps), in-reward KL, observation tokens between policy
// tokens and a response without policy tokens, logged as Train logs them,
// agree with gae_reference.py; one advantage moved by 1e-3 is caught.
func TestGAEReferenceSynthetic(t *testing.T) {
	cfg := config.Default()
	// train.kl_coef differs: the logs must agree with ppo.kl_coef's β.
	cfg.Train.Algorithm, cfg.Train.KLCoef, cfg.PPO.KLCoef = "ppo", 0.7, 0.2
	cfg.PPO.Gamma, cfg.PPO.Lam, cfg.PPO.CostCoef, cfg.PPO.CostWindow = 0.95, 0.9, 0.3, 7
	dir := t.TempDir()
	if err := cfg.Write(filepath.Join(dir, "config.toml")); err != nil {
		t.Fatal(err)
	}
	a := newPPO(cfg.Training()).(ppo)
	r := rand.New(rand.NewSource(11))
	st := &State{}
	var lines []string
	const g = 3
	for step := 1; step <= 4; step++ {
		qs := []data.Example{{ID: "nq/1", Dataset: "nq"}, {ID: "hotpotqa/2", Dataset: "hotpotqa"}}
		b := &stepBatch{qs: qs, g: g, st: st}
		for i := 0; i < len(qs)*g; i++ {
			n := 6 + r.Intn(20)
			s := torchbridge.Sequence{Tokens: make([]int32, n), Mask: make([]float32, n), OldLogp: make([]float32, n),
				RefLogp: make([]float32, n), OldValues: make([]float32, n)}
			for tk := 3; tk < n; tk++ {
				if i == 5 {
					break // no policy tokens
				}
				if tk%7 != 4 { // every 7th token an observation
					s.Mask[tk], s.OldLogp[tk], s.RefLogp[tk] = 1, float32(-2*r.Float64()), float32(-2*r.Float64())
					s.OldValues[tk] = float32(2*r.Float64() - 1)
				}
			}
			b.seqs = append(b.seqs, s)
			rw := router.Rewards{Format: float64(r.Intn(3) / 2), Ans: []float64{0, 0.5, 1}[r.Intn(3)]}
			if rw.Ans == 1 {
				rw.EM = 1
			}
			b.rewards = append(b.rewards, rw)
			b.samples = append(b.samples, router.Sample{Calls: []router.Call{{Cost: r.Float64() * 1e-4}, {Cost: r.Float64() * 1e-4}}})
		}
		a.fill(b)
		for i := range b.seqs {
			raw := map[string]float64{}
			for _, c := range router.Components {
				raw[c] = b.rewards[i].Get(c)
			}
			lines = append(lines, jsonOf(rolloutLine{Step: step, Dataset: qs[i/g].Dataset, Group: i / g, Sample: i % g,
				RewardsRaw: raw, EM: b.rewards[i].EM, Advantage: b.logged.Advantages[i], PPO: b.ppo[i]}))
		}
	}
	write := func(lines []string) {
		if err := os.WriteFile(filepath.Join(dir, "rollouts.jsonl"), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(lines)
	code, d, out := checkGAEReference(t, dir)
	if code != 0 || !(d <= 1e-6) {
		t.Fatalf("gae_reference.py check: exit %d, max diff %v, want 0 and ≤ 1e-6\n%s", code, d, out)
	}
	t.Logf("gae_reference.py on 4 synthetic steps: max |diff| %g", d)

	// A run configuration written before ppo.kl_coef existed: the reference
	// takes train.kl_coef, the β such a run trained with.
	legacy := func(trainKL float64) {
		t.Helper()
		old := cfg
		old.Train.KLCoef = trainKL
		path := filepath.Join(dir, "config.toml")
		if err := old.Write(path); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var kept []string
		table := ""
		for _, line := range strings.Split(string(b), "\n") {
			l := strings.TrimSpace(line)
			if strings.HasPrefix(l, "[") {
				table = l
			}
			if key, _, _ := strings.Cut(l, " ="); table != "[ppo]" || key != "kl_coef" {
				kept = append(kept, line)
			}
		}
		if err := os.WriteFile(path, []byte(strings.Join(kept, "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	legacy(cfg.PPO.KLCoef)
	if code, d, out := checkGAEReference(t, dir); code != 0 || !(d <= 1e-6) {
		t.Fatalf("gae_reference.py check, a config without ppo.kl_coef and train.kl_coef = the run's β: exit %d, max diff %v, want 0\n%s", code, d, out)
	}
	legacy(0.7)
	if code, _, out := checkGAEReference(t, dir); code != 1 {
		t.Fatalf("gae_reference.py check, a config without ppo.kl_coef and another train.kl_coef: exit %d, want 1 (it must read train.kl_coef then)\n%s", code, out)
	}
	if err := cfg.Write(filepath.Join(dir, "config.toml")); err != nil {
		t.Fatal(err)
	}

	var rec map[string]any
	json.Unmarshal([]byte(lines[7]), &rec)
	advs := rec["ppo"].(map[string]any)["advantages"].([]any)
	advs[2] = advs[2].(float64) + 1e-3
	lines[7] = jsonOf(rec)
	write(lines)
	if code, _, out := checkGAEReference(t, dir); code != 1 {
		t.Fatalf("gae_reference.py check with one advantage off by 1e-3: exit %d, want 1\n%s", code, out)
	}
}

// A token chosen under a decoding constraint (router.Sample.Constrained)
// carries no KL penalty in PPO's rewards: its log-prob is the
// unconstrained policy's, far below the reference's here, and −β·KL would
// otherwise pay for pushing it further down.
func TestPPOConstrainedTokensCarryNoKL(t *testing.T) {
	cfg := config.Default()
	cfg.Train.Algorithm, cfg.PPO.KLCoef = "ppo", 0.1
	a := newPPO(cfg.Training()).(ppo)
	const prompt, n = 3, 8
	s := torchbridge.Sequence{Tokens: make([]int32, prompt+n), Mask: make([]float32, prompt+n), OldLogp: make([]float32, prompt+n),
		RefLogp: make([]float32, prompt+n), OldValues: make([]float32, prompt+n)}
	for t := prompt; t < prompt+n; t++ {
		s.Mask[t], s.OldLogp[t], s.RefLogp[t] = 1, -1, -1.5
	}
	s.OldLogp[prompt+5] = -30 // a forced name token the policy meant to write otherwise
	// As the ranks gather it (record): its Mask, not its Tokens.
	sample := record(router.Sample{Tokens: make([]int32, n), Mask: make([]float32, n), Constrained: []int{5}}, router.Rewards{}, 0).Sample
	for _, constrained := range []bool{false, true} {
		smp := sample
		if !constrained {
			smp.Constrained = nil
		}
		b := &stepBatch{qs: []data.Example{{ID: "nq/1", Dataset: "nq"}}, g: 1, st: &State{},
			seqs: []torchbridge.Sequence{s}, rewards: []router.Rewards{{Format: 1}}, samples: []router.Sample{smp}}
		a.fill(b)
		kl := b.ppo[0].KL
		if len(kl) != n {
			t.Fatalf("constrained=%v: %d KL terms, want %d", constrained, len(kl), n)
		}
		want := float32(-28.5)
		if constrained {
			want = 0
		}
		if kl[5] != want {
			t.Errorf("constrained=%v: KL of the constrained token %v, want %v", constrained, kl[5], want)
		}
		if kl[4] != 0.5 {
			t.Errorf("constrained=%v: KL of a free token %v, want 0.5", constrained, kl[4])
		}
	}
}
