package sftdirect_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/internal/testpolicy"
	"github.com/recal-project/recal/torchbridge"
)

func TestMain(m *testing.M) {
	torchbridge.UsePassiveOpenMP() // see its doc: idle OpenMP threads must not spin
	os.Exit(m.Run())
}

func microCheckpoint(t *testing.T) string { return testpolicy.Micro(t, "../..", 1) }

// testConfig is recal.toml made small for tests (trainer's test
// configuration), with sets applied last.

func testConfig(t *testing.T, ck string, sets ...string) config.Config {
	t.Helper()
	all := append([]string{
		"policy.checkpoint=" + ck, "policy.threads=2",
		"data.val_per_dataset=2", "data.test_per_dataset=4",
		"router.turn_tokens=12", "router.info_tokens=8", "router.max_turns=2",
		"sft.steps=2", "sft.batch_size=4", "sft.lr=1e-2",
		"train.steps=4", "train.batch_size=2", "train.group_size=2", "train.micro_batch=3",
		"train.lr=1e-2", "train.weight_decay=0.0", "train.entropy_coef=0.01", "train.kl_coef=0.05",
		"train.checkpoint_every=2", "train.validate_every=2", "eval.batch=4",
		// The paper's constant rate: these tests resume and extend runs,
		// which a decaying schedule refuses (its own tests cover it).
		"train.lr_schedule=constant", "train.warmup_steps=0", "train.min_lr_ratio=0",
	}, sets...)
	cfg, err := config.Load("../../recal.toml", all)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func readJSONL(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, m)
	}
	return out
}
