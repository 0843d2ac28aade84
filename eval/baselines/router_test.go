package baselines

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/recal-project/recal/eval/embed"
)

// topics decide the best model of a synthetic question: a question about
// topic k mentions one of its words, and model k answers it best.
var topics = [][]string{
	{"planet", "galaxy", "telescope", "comet", "orbit", "nebula", "asteroid", "star"},
	{"recipe", "oven", "flour", "baking", "sauce", "kitchen", "spice", "dough"},
	{"football", "tennis", "stadium", "league", "tournament", "goalkeeper", "marathon", "referee"},
}

var fillers = []string{"famous", "old", "largest", "first", "german", "british", "new", "small", "ancient", "modern",
	"city", "river", "century", "author", "king", "museum", "island", "company", "war", "song"}

var templates = []string{
	"Which %s %s was named after the %s in %d?",
	"Who discovered the %s %s near the %s?",
	"What is the %s %s of the %s called?",
	"When did the %s %s first appear in the %s?",
	"Where was the %s %s of the %s built in %d?",
}

// syntheticMatrix has n questions over three models whose best model is the
// topic of the question text (the dataset label is drawn independently, so
// only the text tells): the best model's F1 is 1 with probability 0.9, the
// others' 1 with probability 0.15, else 0. Costs are 1, 2 and 4 micro-USD.
func syntheticMatrix(n int, seed uint64) (*Matrix, []int) {
	rng := rand.New(rand.NewPCG(seed, 7))
	m := &Matrix{Models: []string{"m-astro", "m-food", "m-sport"}}
	m.Pool = PoolInfo{Version: poolVersion, ID: "sha256:synthetic", Models: []ModelInfo{
		{Name: "m-astro", Description: "knows the sky"}, {Name: "m-food", Description: "knows cooking"},
		{Name: "m-sport", Description: "knows games"}}}
	best := make([]int, n)
	for i := range n {
		k := rng.IntN(3)
		best[i] = k
		tm := templates[rng.IntN(len(templates))]
		word := topics[k][rng.IntN(len(topics[k]))]
		f1, f2 := fillers[rng.IntN(len(fillers))], fillers[rng.IntN(len(fillers))]
		var text string
		if strings.Count(tm, "%") == 4 {
			text = fmt.Sprintf(tm, f1, word, f2, 1800+rng.IntN(220))
		} else {
			text = fmt.Sprintf(tm, f1, word, f2)
		}
		m.Questions = append(m.Questions, Question{ID: fmt.Sprintf("q%05d", i), Dataset: []string{"nq", "hotpotqa"}[rng.IntN(2)], Text: text})
		row := make([]float64, 3)
		for j := range row {
			p := 0.15
			if j == k {
				p = 0.9
			}
			if rng.Float64() < p {
				row[j] = 1
			}
		}
		m.F1 = append(m.F1, row)
		m.EM = append(m.EM, slices.Clone(row))
		m.Cost = append(m.Cost, []float64{1e-6, 2e-6, 4e-6})
		m.Failed = append(m.Failed, make([]bool, 3))
	}
	m.seal()
	return m, best
}

func localEmbedder(t testing.TB, dim int) embed.Embedder {
	t.Helper()
	cfg := embed.DefaultConfig()
	cfg.Dim = dim
	e, err := embed.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// Each trainable router learns: fitted on 900 synthetic questions whose
// best model is a function of the text, it routes 300 held-out questions
// (new texts) to that model far above chance (1/3). The accuracies are
// logged (go test -v -run TestRoutersLearn).
func TestRoutersLearn(t *testing.T) {
	m, _ := syntheticMatrix(900, 1)
	held, best := syntheticMatrix(300, 2)
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			r, err := Fit(context.Background(), name, DefaultConfig(), m, localEmbedder(t, 1024), 0)
			if err != nil {
				t.Fatal(err)
			}
			qs := make([]Query, len(held.Questions))
			for i, q := range held.Questions {
				qs[i] = Query{Text: q.Text, Dataset: q.Dataset}
			}
			picks, err := r.Route(context.Background(), qs)
			if err != nil {
				t.Fatal(err)
			}
			right := 0
			for i, p := range picks {
				if p == m.Models[best[i]] {
					right++
				}
			}
			acc := float64(right) / float64(len(picks))
			t.Logf("%s: %d/%d held-out questions routed to their best model (%.3f; chance 0.333)", name, right, len(picks), acc)
			if acc < 0.8 {
				t.Errorf("%s routes %.3f of held-out questions to their best model, want ≥ 0.8 (chance is 0.333): it did not learn", name, acc)
			}
		})
	}
}

// Fitting twice with one seed writes byte-identical folders (manifest,
// weights, embedding state); another seed other weights. A loaded router
// scores exactly as the fitted one.
func TestFitDeterministicAndRoundTrip(t *testing.T) {
	m, _ := syntheticMatrix(200, 3)
	cfg := DefaultConfig()
	cfg.MLP.Epochs, cfg.RouteLLMMF.Epochs, cfg.RouterDC.Epochs, cfg.GraphRouter.Steps = 3, 3, 3, 10
	qs := []Query{{Text: "Which old telescope was built in 1900?", Dataset: "nq"}, {Text: "Who baked the dough?", Dataset: "popqa"}}
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			dirs := map[int64][]string{}
			var first *Router
			for _, seed := range []int64{5, 5, 6} {
				r, err := Fit(context.Background(), name, cfg, m, localEmbedder(t, 256), seed)
				if err != nil {
					t.Fatal(err)
				}
				dir := filepath.Join(t.TempDir(), name)
				if err := r.Save(dir); err != nil {
					t.Fatal(err)
				}
				dirs[seed] = append(dirs[seed], dir)
				if first == nil {
					first = r
				}
			}
			for _, f := range []string{ManifestFile, WeightsFile, EmbeddingStateFile} {
				a, _ := os.ReadFile(filepath.Join(dirs[5][0], f))
				b, _ := os.ReadFile(filepath.Join(dirs[5][1], f))
				if len(a) == 0 || !bytes.Equal(a, b) {
					t.Errorf("%s differs between two fits with seed 5 (%d and %d bytes): fits must repeat", f, len(a), len(b))
				}
			}
			a, _ := os.ReadFile(filepath.Join(dirs[5][0], WeightsFile))
			c, _ := os.ReadFile(filepath.Join(dirs[6][0], WeightsFile))
			if bytes.Equal(a, c) {
				t.Error("seeds 5 and 6 gave the same weights: the seed is not used")
			}
			loaded, err := Load(dirs[5][0], localEmbedder(t, 256))
			if err != nil {
				t.Fatal(err)
			}
			want, err := first.Scores(context.Background(), qs)
			if err != nil {
				t.Fatal(err)
			}
			got, err := loaded.Scores(context.Background(), qs)
			if err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if !slices.Equal(want[i], got[i]) {
					t.Errorf("question %d: loaded router scores %v, fitted one %v", i, got[i], want[i])
				}
			}
			d1, _ := Digest(dirs[5][0])
			d2, _ := Digest(dirs[5][1])
			d3, _ := Digest(dirs[6][0])
			if d1 == "" || d1 != d2 || d1 == d3 {
				t.Errorf("digests %s, %s (same fit) and %s (other seed): want equal, then different", d1, d2, d3)
			}
		})
	}
}

// A folder that does not read back as written is a named error (ErrCorrupt);
// a missing one ErrNotFitted; other embeddings ErrEmbedding.
func TestLoadErrors(t *testing.T) {
	m, _ := syntheticMatrix(60, 4)
	cfg := DefaultConfig()
	cfg.MLP.Epochs = 1
	r, err := Fit(context.Background(), "mlp", cfg, m, localEmbedder(t, 64), 0)
	if err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(t.TempDir(), "mlp")
	if err := r.Save(good); err != nil {
		t.Fatal(err)
	}
	flip := func(name string) func(string) {
		return func(dir string) {
			p := filepath.Join(dir, name)
			b, _ := os.ReadFile(p)
			b[len(b)-3] ^= 0x40
			os.WriteFile(p, b, 0o644)
		}
	}
	edit := func(name, from, to string) func(string) {
		return func(dir string) {
			p := filepath.Join(dir, name)
			b, _ := os.ReadFile(p)
			os.WriteFile(p, bytes.Replace(b, []byte(from), []byte(to), 1), 0o644)
		}
	}
	cases := []struct {
		name   string
		break_ func(dir string)
		emb    embed.Embedder
		want   error
		text   string
	}{
		{"missing folder", func(dir string) { os.RemoveAll(dir) }, nil, ErrNotFitted, "no folder"},
		{"no manifest", func(dir string) { os.Remove(filepath.Join(dir, ManifestFile)) }, nil, ErrCorrupt, ManifestFile},
		{"manifest not json", func(dir string) { os.WriteFile(filepath.Join(dir, ManifestFile), []byte("{"), 0o644) }, nil, ErrCorrupt, ManifestFile},
		{"unknown router", edit(ManifestFile, `"router": "mlp"`, `"router": "oracle"`), nil, ErrCorrupt, `unknown router "oracle"`},
		{"unknown manifest key", edit(ManifestFile, `"router"`, `"routr"`), nil, ErrCorrupt, "unknown field"},
		{"no weights", func(dir string) { os.Remove(filepath.Join(dir, WeightsFile)) }, nil, ErrCorrupt, WeightsFile},
		{"flipped weight byte", flip(WeightsFile), nil, ErrCorrupt, "digest"},
		{"flipped state byte", flip(EmbeddingStateFile), nil, ErrCorrupt, "digest"},
		{"other embedding size", func(string) {}, localEmbedder(t, 128), ErrEmbedding, "fit it again"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "mlp")
			if err := os.CopyFS(dir, os.DirFS(good)); err != nil {
				t.Fatal(err)
			}
			c.break_(dir)
			emb := c.emb
			if emb == nil {
				emb = localEmbedder(t, 64)
			}
			_, err := Load(dir, emb)
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.text) {
				t.Fatalf("error %v, want %v mentioning %q", err, c.want, c.text)
			}
		})
	}
	if _, err := Fit(context.Background(), "oracle", cfg, m, localEmbedder(t, 64), 0); err == nil || !strings.Contains(err.Error(), "known: graphrouter, mlp, routellm-mf, routerdc") {
		t.Errorf("unknown router: error %v, want one listing the known routers", err)
	}
}
