package torchbridge_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/internal/tokenizer"
	"github.com/recal-project/recal/torchbridge"
)

// The golden file is written by testdata/qwen2_ref.py, an independent Qwen2
// (Hugging Face modeling_qwen2, eager, no KV cache). Weights are not stored:
// both sides generate them with the PRNG of testdata/README.md.
type golden struct {
	Prompts []struct {
		Text string  `json:"text"`
		IDs  []int32 `json:"ids"`
	} `json:"prompts"`
	Prng struct {
		Rules []struct {
			Suffix string  `json:"suffix"`
			Scale  float64 `json:"scale"`
			Offset float64 `json:"offset"`
		} `json:"rules"`
		Pinned struct {
			Seed             uint64    `json:"seed"`
			Name             string    `json:"name"`
			Scale            float64   `json:"scale"`
			First4           []float32 `json:"first4"`
			Fnv1a64Hex       string    `json:"fnv1a64_hex"`
			SplitmixElem0Hex string    `json:"splitmix64_elem0_hex"`
		} `json:"pinned"`
	} `json:"prng"`
	MaxNewTokens int `json:"max_new_tokens"`
	Cases        []struct {
		Name    string          `json:"name"`
		Config  json.RawMessage `json:"config"`
		Seed    uint64          `json:"seed"`
		Tensors []struct {
			Name   string    `json:"name"`
			Shape  []int64   `json:"shape"`
			Scale  float64   `json:"scale"`
			Offset float64   `json:"offset"`
			First4 []float32 `json:"first4"`
			Sum    float64   `json:"sum_seq_f64"`
			Hash31 string    `json:"hash31"`
		} `json:"tensors"`
		Results []struct {
			PromptIDs     []int32   `json:"prompt_ids"`
			Generated     []int32   `json:"generated_ids"`
			First16       []float64 `json:"prefill_logits_first16"`
			ArgmaxID      int32     `json:"prefill_argmax_id"`
			ArgmaxLogit   float64   `json:"prefill_argmax_logit"`
			PrefillLogSum float64   `json:"prefill_logsumexp"`
		} `json:"results"`
	} `json:"cases"`
	Scoring struct {
		Case       string               `json:"case"`
		IDs        []int32              `json:"ids"`
		Logprobs   []float64            `json:"logprobs"`
		Entropies  []float64            `json:"entropies"`
		Loss       float64              `json:"loss"`
		GradNorms  map[string]float64   `json:"grad_norms"`
		GradFirst8 map[string][]float64 `json:"grad_first8"`
	} `json:"scoring"`
}

func splitmix64(z uint64) uint64 {
	z += 0x9E3779B97F4A7C15
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

func fnv1a64(s string) uint64 {
	h := uint64(0xcbf29ce484222325)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * 0x100000001b3
	}
	return h
}

// prngTensor generates a tensor of the fixture PRNG.
func prngTensor(name string, seed uint64, n int64, scale, offset float64) []float32 {
	base := fnv1a64(name) ^ seed
	out := make([]float32, n)
	for i := range out {
		u := float64(splitmix64(base+uint64(i))>>40) / (1 << 24)
		r := (2*u - 1) * scale
		out[i] = float32(offset + float64(r))
	}
	return out
}

func loadGolden(t *testing.T) *golden {
	t.Helper()
	b, err := os.ReadFile("testdata/qwen2_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g golden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	return &g
}

func TestGoldenPRNG(t *testing.T) {
	g := loadGolden(t)
	pin := g.Prng.Pinned
	if got := strconv.FormatUint(fnv1a64(pin.Name), 16); "0x"+got != pin.Fnv1a64Hex {
		t.Errorf("fnv1a64(%q) = 0x%s, want %s", pin.Name, got, pin.Fnv1a64Hex)
	}
	if got := strconv.FormatUint(splitmix64(fnv1a64(pin.Name)^pin.Seed), 16); "0x"+got != pin.SplitmixElem0Hex {
		t.Errorf("splitmix64(base) = 0x%s, want %s", got, pin.SplitmixElem0Hex)
	}
	v := prngTensor(pin.Name, pin.Seed, 4, pin.Scale, 0)
	for i := range v {
		if v[i] != pin.First4[i] {
			t.Errorf("value %d = %v, want %v", i, v[i], pin.First4[i])
		}
	}
}

// goldenPolicy builds the policy of one case with the PRNG weights, checking
// every tensor against the reference's hash of it.
func goldenPolicy(t *testing.T, g *golden, ci int) *torchbridge.Policy {
	t.Helper()
	c := g.Cases[ci]
	cfg, err := hfmodel.ParseConfig(c.Name+"/config.json", c.Config)
	if err != nil {
		t.Fatal(err)
	}
	p, err := torchbridge.NewPolicy(cfg, onDevice(torchbridge.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	shapes := map[string][]int64{}
	for _, pr := range p.Params() {
		shapes[pr.Name] = pr.Shape
	}
	if len(c.Tensors) != len(p.Params()) {
		t.Fatalf("%s: the reference has %d tensors, the policy %d", c.Name, len(c.Tensors), len(p.Params()))
	}
	for _, tn := range c.Tensors {
		if !slices.Equal(shapes[tn.Name], tn.Shape) {
			t.Fatalf("%s: tensor %s: policy shape %v, reference %v", c.Name, tn.Name, shapes[tn.Name], tn.Shape)
		}
		n := int64(1)
		for _, d := range tn.Shape {
			n *= d
		}
		v := prngTensor(tn.Name, c.Seed, n, tn.Scale, tn.Offset)
		var h uint64
		buf := make([]byte, 4*n)
		for i, x := range v {
			h = h*31 + uint64(math.Float32bits(x))
			binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(x))
		}
		if strconv.FormatUint(h, 10) != tn.Hash31 {
			t.Fatalf("%s: tensor %s: PRNG hash %d, reference %s: the weights differ", c.Name, tn.Name, h, tn.Hash31)
		}
		if err := p.SetParam(tn.Name, "F32", buf); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// Greedy generation equals the reference's on every case (tied and untied
// heads, GQA, MQA and MHA, q/k/v biases) for every prompt, all prompts of a
// case decoded together in one KV cache.
func TestGoldenGreedy(t *testing.T) {
	ctx := context.Background()
	g := loadGolden(t)
	tok, err := tokenizer.Load("../tokenizer/qwen2.5")
	if err != nil {
		t.Fatal(err)
	}
	for _, pr := range g.Prompts { // the prompts are real tokenizations of tricky text
		if got := tok.Encode(pr.Text); !equalIDs(got, pr.IDs) {
			t.Errorf("Encode(%q) = %v, the fixture holds %v", pr.Text, got, pr.IDs)
		}
	}
	if g.MaxNewTokens < 24 {
		t.Fatalf("the fixture generates %d tokens; at least 24 are needed to exercise the cache", g.MaxNewTokens)
	}
	for ci, c := range g.Cases {
		t.Run(c.Name, func(t *testing.T) {
			p := goldenPolicy(t, g, ci)
			n := len(c.Results)
			cache, err := p.NewCache(n, 128)
			if err != nil {
				t.Fatal(err)
			}
			defer cache.Close()
			step := torchbridge.Step{WantLogits: true}
			for i, r := range c.Results {
				step.Rows = append(step.Rows, i)
				step.Tokens = append(step.Tokens, r.PromptIDs)
			}
			got := make([][]int32, n)
			for k := 0; k < g.MaxNewTokens; k++ {
				res, err := cache.Extend(ctx, step)
				if err != nil {
					t.Fatal(err)
				}
				for i := range got {
					got[i] = append(got[i], res.Next[i])
					step.Tokens[i] = []int32{res.Next[i]}
				}
				if k == 0 {
					for i, r := range c.Results {
						checkPrefill(t, i, res.Logits[i], r.First16, r.ArgmaxID, r.ArgmaxLogit, r.PrefillLogSum)
					}
					step.WantLogits = false
				}
			}
			for i, r := range c.Results {
				if !slices.Equal(got[i], r.Generated) {
					t.Errorf("prompt %d: generated %v, reference %v", i, got[i], r.Generated)
				}
			}
		})
	}
}

func checkPrefill(t *testing.T, i int, logits []float32, first16 []float64, argmax int32, argLogit, lse float64) {
	t.Helper()
	for k, want := range first16 {
		if d := math.Abs(float64(logits[k]) - want); d > 1e-3 {
			t.Errorf("prompt %d: prefill logit %d = %v, reference %v", i, k, logits[k], want)
		}
	}
	if d := math.Abs(float64(logits[argmax]) - argLogit); d > 1e-3 {
		t.Errorf("prompt %d: logit of the argmax %d = %v, reference %v", i, argmax, logits[argmax], argLogit)
	}
	m := math.Inf(-1)
	for _, v := range logits {
		m = math.Max(m, float64(v))
	}
	var z float64
	for _, v := range logits {
		z += math.Exp(float64(v) - m)
	}
	if got := m + math.Log(z); math.Abs(got-lse) > 1e-3 {
		t.Errorf("prompt %d: logsumexp of the prefill logits %v, reference %v", i, got, lse)
	}
}

// Log-probs, entropies and gradients of the mean NLL match the reference.
func TestGoldenScoreAndGradients(t *testing.T) {
	ctx := context.Background()
	g := loadGolden(t)
	ci := -1
	for i, c := range g.Cases {
		if c.Name == g.Scoring.Case {
			ci = i
		}
	}
	if ci < 0 {
		t.Fatalf("no case %q", g.Scoring.Case)
	}
	p := goldenPolicy(t, g, ci)
	sc := g.Scoring
	lp, ent, err := p.Score(ctx, [][]int32{sc.IDs})
	if err != nil {
		t.Fatal(err)
	}
	for k := range sc.Logprobs {
		if d := math.Abs(float64(lp[0][k+1]) - sc.Logprobs[k]); d > 1e-4 {
			t.Errorf("log p(token %d) = %v, reference %v", k+1, lp[0][k+1], sc.Logprobs[k])
		}
		if d := math.Abs(float64(ent[0][k+1]) - sc.Entropies[k]); d > 1e-4 {
			t.Errorf("entropy at %d = %v, reference %v", k+1, ent[0][k+1], sc.Entropies[k])
		}
	}
	mask := make([]float32, len(sc.IDs))
	for k := 1; k < len(mask); k++ {
		mask[k] = 1
	}
	nll, _, err := p.BackwardNLL(ctx, [][]int32{sc.IDs}, [][]float32{mask}, 1/float64(len(sc.Logprobs)), 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := nll / float64(len(sc.Logprobs)); math.Abs(got-sc.Loss) > 1e-4 {
		t.Errorf("mean NLL %v, reference %v", got, sc.Loss)
	}
	for _, pr := range p.Params() {
		want, ok := sc.GradNorms[pr.Name]
		if !ok {
			t.Errorf("the reference has no gradient for %s", pr.Name)
			continue
		}
		grad := getF32(t, p, "grad/"+pr.Name, pr.Numel())
		var sq float64
		for _, v := range grad {
			sq += float64(v) * float64(v)
		}
		if got := math.Sqrt(sq); math.Abs(got-want) > 1e-3*want+1e-7 {
			t.Errorf("‖∂loss/∂%s‖ = %.7g, reference %.7g", pr.Name, got, want)
		}
		if f8, ok := sc.GradFirst8[pr.Name]; ok {
			for k, w := range f8 {
				if math.Abs(float64(grad[k])-w) > 1e-4*math.Max(1, math.Abs(w))+1e-6 {
					t.Errorf("∂loss/∂%s[%d] = %v, reference %v", pr.Name, k, grad[k], w)
				}
			}
		}
		for key, f8 := range sc.GradFirst8 {
			if !strings.HasPrefix(key, pr.Name+"[row ") {
				continue
			}
			row, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(key, pr.Name+"[row "), "]"))
			width := int(pr.Shape[1])
			for k, w := range f8 {
				if v := grad[row*width+k]; math.Abs(float64(v)-w) > 1e-4*math.Max(1, math.Abs(w))+1e-6 {
					t.Errorf("%s: element %d = %v, reference %v", key, k, v, w)
				}
			}
		}
	}
}

func equalIDs(a []int, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if int32(a[i]) != b[i] {
			return false
		}
	}
	return true
}
