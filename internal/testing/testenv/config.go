package testenv

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/recal-project/recal/config"
)

// Config is the repository's recal.toml (root is the repository's root,
// relative to the test's package) made small for tests: a micro policy ck
// on 2 threads, short turns, a few warm-up and GRPO steps of small groups,
// a constant learning rate (these tests resume and extend runs, which a
// decaying schedule refuses); sets are applied last.
func Config(t testing.TB, root, ck string, sets ...string) config.Config {
	t.Helper()
	all := append([]string{
		"policy.checkpoint=" + ck, "policy.threads=2",
		"data.val_per_dataset=2", "data.test_per_dataset=4",
		"router.turn_tokens=12", "router.info_tokens=8", "router.max_turns=2",
		"sft.steps=2", "sft.batch_size=4", "sft.lr=1e-2",
		"train.steps=4", "train.batch_size=2", "train.group_size=2", "train.micro_batch=3",
		"train.lr=1e-2", "train.weight_decay=0.0", "train.entropy_coef=0.01", "train.kl_coef=0.05",
		"train.checkpoint_every=2", "train.validate_every=2", "eval.batch=4",
		"train.lr_schedule=constant", "train.warmup_steps=0", "train.min_lr_ratio=0",
	}, sets...)
	cfg, err := config.Load(filepath.Join(root, "recal.toml"), all)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// ReadJSONL reads a JSON Lines file into one map per line, failing the
// test on a line that is not a JSON object.
func ReadJSONL(t testing.TB, path string) []map[string]any {
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

// Mtimes maps every file under dir to its modification time, so a test can
// tell which files a rerun wrote.
func Mtimes(t testing.TB, dir string) map[string]time.Time {
	t.Helper()
	out := map[string]time.Time{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		out[p] = info.ModTime()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
