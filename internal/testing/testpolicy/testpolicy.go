// Package testpolicy writes very small policy checkpoints for tests: a
// 1-layer Qwen2 with the real Qwen2.5 vocabulary and tokenizer, so runs that
// go through training or evaluation take seconds.
package testpolicy

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/torchbridge"
)

// Micro writes a micro checkpoint initialised from seed into a temporary
// folder and returns it. repo is the path from the test's package to the
// repository root (for the vendored tokenizer).
func Micro(t testing.TB, repo string, seed uint64) string {
	t.Helper()
	cfg := &hfmodel.Config{Architectures: []string{"Qwen2ForCausalLM"}, ModelType: "qwen2", VocabSize: 151936,
		HiddenSize: 16, IntermediateSize: 32, NumHiddenLayers: 1, NumAttentionHeads: 2, NumKeyValueHeads: 1,
		MaxPositionEmbeddings: 2048, RopeTheta: 1e6, RMSNormEps: 1e-6, TieWordEmbeddings: true, EOSTokenIDs: []int64{151645, 151643}}
	p, err := torchbridge.NewPolicy(cfg, torchbridge.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.InitRandom(seed, 0.05); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join(repo, "tokenizer", "qwen2.5", f))
		if err != nil {
			t.Fatal(err)
		}
		p.Aux[f] = b
	}
	dir := filepath.Join(t.TempDir(), "policy")
	if err := p.Save(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}
