package torchbridge_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"math"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/recal-project/recal/torchbridge"
)

// update regenerates testdata/loss_golden.json with testdata/loss_reference.py.
var update = flag.Bool("update", false, "regenerate testdata/loss_golden.json (with loss_reference.py)")

// pythonTorch finds a python3 that imports torch (Debian's python3-torch is
// under /usr/bin; a pyenv python3 on PATH may lack it), or "" and why not.
func pythonTorch() (string, string) {
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		path, err := exec.LookPath(p)
		if err != nil {
			continue
		}
		if exec.Command(path, "-c", "import torch").Run() == nil {
			return path, ""
		}
	}
	return "", "no python3 that can import torch (install python3-torch): cannot run testdata/loss_reference.py"
}

// lossDump is the input of loss_reference.py: the loss options and, per
// sequence, the per-token quantities the loss is made of (token-indexed, as
// torchbridge.Sequence).
type lossDump struct {
	ClipEps     float64       `json:"clip_eps"`
	KLCoef      float64       `json:"kl_coef"`
	EntropyCoef float64       `json:"entropy_coef"`
	Sequences   []dumpedTrace `json:"sequences"`
}

type dumpedTrace struct {
	Advantage float32   `json:"advantage"`
	Mask      []float32 `json:"mask"`
	Logp      []float32 `json:"logp"` // under the policy being trained (Score)
	OldLogp   []float32 `json:"old_logp"`
	RefLogp   []float32 `json:"ref_logp,omitempty"`
	Entropy   []float32 `json:"entropy"`
}

// lossStats is loss_reference.py's output and the golden file's numbers.
type lossStats struct {
	Loss    float64 `json:"loss"`
	Tokens  float64 `json:"tokens"`
	Clipped float64 `json:"clipped"`
	KL      float64 `json:"kl"`
	Entropy float64 `json:"entropy"`
	Ratio   float64 `json:"ratio"`
}

type lossGolden struct {
	Generator string `json:"generator"`
	Cases     []struct {
		Name      string    `json:"name"`
		Input     lossDump  `json:"input"`
		Reference lossStats `json:"reference"`
	} `json:"cases"`
}

type lossCase struct {
	name                     string
	clipEps, klCoef, entCoef float64
	withRef                  bool
}

var lossCases = []lossCase{
	{"clipped ratio, k3 KL and entropy bonus", 0.2, 0.3, 0.05, true},
	{"no reference policy", 0.1, 0, 0, false},
}

// runLoss runs the bridge's loss as the trainer does (two micro-batches of
// one mini-batch, scale 1/policy tokens) on a small real policy and returns
// the per-token quantities and the summed stats it reported.
func runLoss(t *testing.T, c lossCase) (lossDump, lossStats) {
	t.Helper()
	ctx := context.Background()
	const vocab = 37
	p := newTiny(t, vocab, true, 9)
	r := rand.New(rand.NewSource(21))
	lengths := []int{11, 8, 14, 6}
	advs := []float32{1.3, -0.7, 0, 2.1}
	seqs := make([]torchbridge.Sequence, len(lengths))
	toks := make([][]int32, len(lengths))
	tokens := 0.0
	for i, n := range lengths {
		s := torchbridge.Sequence{Tokens: randomSeq(r, n, vocab), Advantage: advs[i], Mask: make([]float32, n)}
		for j := 3; j < n; j++ {
			if i == 2 && j >= 7 && j < 10 { // an <information> block: not the policy's tokens
				continue
			}
			s.Mask[j] = 1
			tokens++
		}
		seqs[i], toks[i] = s, s.Tokens
	}
	logp, ent, err := p.Score(ctx, toks)
	if err != nil {
		t.Fatal(err)
	}
	dump := lossDump{ClipEps: c.clipEps, KLCoef: c.klCoef, EntropyCoef: c.entCoef}
	for i := range seqs {
		// Sampling and reference log-probs near the current ones, so that
		// ratios fall inside and on both sides outside [1−ε, 1+ε].
		seqs[i].OldLogp = make([]float32, len(logp[i]))
		if c.withRef {
			seqs[i].RefLogp = make([]float32, len(logp[i]))
		}
		for j := range logp[i] {
			seqs[i].OldLogp[j] = logp[i][j] + float32(r.NormFloat64()*0.3)
			if c.withRef {
				seqs[i].RefLogp[j] = logp[i][j] + float32(r.NormFloat64()*0.5)
			}
		}
		dump.Sequences = append(dump.Sequences, dumpedTrace{Advantage: seqs[i].Advantage, Mask: seqs[i].Mask,
			Logp: logp[i], OldLogp: seqs[i].OldLogp, RefLogp: seqs[i].RefLogp, Entropy: ent[i]})
	}
	opt := torchbridge.LossOptions{ClipEps: c.clipEps, KLCoef: c.klCoef, EntropyCoef: c.entCoef, Scale: 1 / tokens}
	var sum torchbridge.LossStats
	for _, mb := range [][]torchbridge.Sequence{seqs[:2], seqs[2:]} {
		st, err := p.Backward(ctx, mb, opt)
		if err != nil {
			t.Fatal(err)
		}
		sum.Add(st)
	}
	return dump, lossStats{Loss: sum.Loss, Tokens: sum.Tokens, Clipped: sum.Clipped, KL: sum.KL, Entropy: sum.Entropy, Ratio: sum.Ratio}
}

// runReference runs loss_reference.py on a dump.
func runReference(t *testing.T, py string, dump lossDump) lossStats {
	t.Helper()
	in, err := json.Marshal(dump)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "loss_input.json")
	if err := os.WriteFile(path, in, 0o644); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(py, filepath.Join("testdata", "loss_reference.py"), path)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("loss_reference.py %s: %v\n%s", path, err, stderr.String())
	}
	var ref lossStats
	if err := json.Unmarshal(out, &ref); err != nil {
		t.Fatalf("loss_reference.py output %q: %v", out, err)
	}
	return ref
}

// compareStats checks the bridge's stats against a reference: the loss to
// tol absolutely, the token sums to tol relatively, the clipped count exactly.
func compareStats(t *testing.T, what string, got, want lossStats, tol float64) {
	t.Helper()
	if math.Abs(got.Loss-want.Loss) > tol {
		t.Errorf("loss %.8f, %s %.8f (|diff| %.2e > %g): the bridge's GRPO objective is not the clipped PPO/k3/entropy token mean",
			got.Loss, what, want.Loss, math.Abs(got.Loss-want.Loss), tol)
	}
	for _, f := range []struct {
		name      string
		got, want float64
	}{{"tokens", got.Tokens, want.Tokens}, {"kl", got.KL, want.KL}, {"entropy", got.Entropy, want.Entropy}, {"ratio", got.Ratio, want.Ratio}} {
		if math.Abs(f.got-f.want) > tol*math.Max(1, math.Abs(f.want)) {
			t.Errorf("stats.%s %.8f, %s %.8f: the logged statistic disagrees with its definition", f.name, f.got, what, f.want)
		}
	}
	if got.Clipped != want.Clipped {
		t.Errorf("stats.clipped %v tokens, %s %v", got.Clipped, what, want.Clipped)
	}
}

// The GRPO loss and its statistics agree with an independent float64
// reference (testdata/loss_reference.py) computed from the per-token
// log-probs, entropies, mask and advantages the bridge itself reports: live
// when a python3 with torch is present, and always against the numbers it
// produced (testdata/loss_golden.json; regenerate with -update).
func TestLossMatchesReference(t *testing.T) {
	py, why := pythonTorch()
	goldenPath := filepath.Join("testdata", "loss_golden.json")
	var golden lossGolden
	if *update {
		if py == "" {
			t.Fatal(why)
		}
		golden.Generator = "torchbridge/testdata/loss_reference.py via go test ./torchbridge -run TestLossMatchesReference -update"
	} else {
		b, err := os.ReadFile(goldenPath)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &golden); err != nil {
			t.Fatalf("%s: %v", goldenPath, err)
		}
		if len(golden.Cases) != len(lossCases) {
			t.Fatalf("%s has %d cases, want %d: rerun with -update", goldenPath, len(golden.Cases), len(lossCases))
		}
	}
	for ci, c := range lossCases {
		t.Run(c.name, func(t *testing.T) {
			dump, got := runLoss(t, c)
			if got.Clipped == 0 || got.Clipped == got.Tokens {
				t.Fatalf("%v of %v tokens clipped: the case should exercise both branches of the clip", got.Clipped, got.Tokens)
			}
			if *update {
				golden.Cases = append(golden.Cases, struct {
					Name      string    `json:"name"`
					Input     lossDump  `json:"input"`
					Reference lossStats `json:"reference"`
				}{c.name, dump, runReference(t, py, dump)})
			}
			g := golden.Cases[ci]
			t.Run("golden", func(t *testing.T) {
				if g.Name != c.name {
					t.Fatalf("golden case %d is %q, want %q: rerun with -update", ci, g.Name, c.name)
				}
				// The golden numbers hold for this input only: the
				// per-token quantities must be the ones they were made from.
				for i, s := range dump.Sequences {
					gs := g.Input.Sequences[i]
					for j := range s.Logp {
						if math.Abs(float64(s.Logp[j]-gs.Logp[j])) > 1e-5 || math.Abs(float64(s.Entropy[j]-gs.Entropy[j])) > 1e-5 {
							t.Fatalf("sequence %d token %d: log-prob %v entropy %v, golden input has %v, %v: the policy computes differently than when %s was made (-update if intended)",
								i, j, s.Logp[j], s.Entropy[j], gs.Logp[j], gs.Entropy[j], goldenPath)
						}
					}
				}
				compareStats(t, "golden reference", got, g.Reference, 1e-5)
			})
			t.Run("python", func(t *testing.T) {
				if py == "" {
					t.Skip(why)
				}
				compareStats(t, "loss_reference.py", got, runReference(t, py, dump), 1e-5)
			})
		})
	}
	if *update && !t.Failed() {
		b, err := json.MarshalIndent(golden, "", " ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(goldenPath, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
