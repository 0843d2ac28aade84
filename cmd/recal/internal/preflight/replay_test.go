package preflight

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/recal-project/recal/config"
)

// A config whose pool replays an outcome log is refused by Replay when a
// question of [data] has no row in the log, naming the question; with every
// question logged it passes, the log's path resolved against the file's
// folder by config.Load, which reads no data itself.
func TestReplayCoverage(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	qrow := func(id string) string {
		return `{"id": "` + id + `", "question": "question ` + id + `?", "golden_answers": ["a"], "dataset": "nq"}` + "\n"
	}
	lrow := func(id string) string {
		return `{"dataset": "nq", "question_id": "nq/` + id + `", "question": "question ` + id + `?", "golden_answers": ["a"], "model": "m", "correct": true}` + "\n"
	}
	write("qa/nq/train.jsonl", qrow("1")+qrow("2")+qrow("3"))
	write("qa/nq/test.jsonl", qrow("4"))
	write("logs/full.jsonl", lrow("1")+lrow("2")+lrow("3")+lrow("4"))
	write("logs/partial.jsonl", lrow("1")+lrow("2")+lrow("4"))
	cfg := func(log string) string {
		return `[data]
dir = "qa"
train = ["nq"]
test = ["nq"]
val_per_dataset = 1
[[pool.models]]
name = "m"
description = "a replayed model"
provider = "replay"
  [pool.models.replay]
  log = "` + log + `"
`
	}
	write("full.toml", cfg("logs/full.jsonl"))
	write("partial.toml", cfg("logs/partial.jsonl"))
	c, err := config.Load(filepath.Join(dir, "full.toml"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := Replay(c); err != nil {
		t.Fatalf("every question is logged: %v", err)
	}
	if got, want := c.Pool.Models[0].Replay.Log, filepath.Join(dir, "logs/full.jsonl"); got != want {
		t.Errorf("replay.log resolved to %q, want %q (relative to the config's folder)", got, want)
	}
	partial, err := config.Load(filepath.Join(dir, "partial.toml"), nil)
	if err != nil {
		t.Fatalf("config.Load reads no log, so a partial one loads: %v", err)
	}
	err = Replay(partial)
	if err == nil || !strings.Contains(err.Error(), `for question "nq/3" (1 of the 4 questions of [data] are missing)`) {
		t.Fatalf("error %v, want one naming nq/3, the question the log lacks", err)
	}
}
