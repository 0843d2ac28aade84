package eval

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/recal-project/recal/llmpool"
)

// A pool with a replayed model names the replay rule's version in its
// identity, so results made under an earlier rule are not resumed; a pool
// without one keeps the identity it had before the version existed.
func TestPoolIdentityNamesTheReplayVersion(t *testing.T) {
	sim := llmpool.ModelConfig{Name: "s", Provider: "sim", PriceIn: 1, PriceOut: 1}
	replay := llmpool.ModelConfig{Name: "r", Provider: "replay", PriceIn: 1, PriceOut: 1, Replay: &llmpool.ReplayConfig{Log: "log.jsonl", Model: "r"}}
	want := fmt.Sprintf(`"Replay":%d`, llmpool.ReplayVersion)
	for _, c := range []struct {
		name   string
		models []llmpool.ModelConfig
		has    bool
	}{{"sim only", []llmpool.ModelConfig{sim}, false}, {"a replayed model", []llmpool.ModelConfig{sim, replay}, true}} {
		v, err := inputParts["pool"](Setup{Pool: llmpool.Config{Models: c.models}})
		if err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(string(b), want); got != c.has || strings.Contains(string(b), `"Replay":0`) {
			t.Errorf("%s: pool identity %s: holds %s %v, want %v", c.name, b, want, got, c.has)
		}
	}
}
