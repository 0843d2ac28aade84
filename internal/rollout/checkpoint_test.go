package rollout

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// ResolveCheckpoint takes a checkpoint folder as it is and a run folder to
// its best checkpoint, else its last.
func TestResolveCheckpoint(t *testing.T) {
	mk := func(t *testing.T, dir string) {
		t.Helper()
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range CheckpointFiles {
			if err := os.WriteFile(filepath.Join(dir, f), []byte("{}"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	link := func(t *testing.T, target, name string) {
		t.Helper()
		if err := os.Symlink(target, name); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name      string
		setup     func(t *testing.T, run string) string // returns the argument
		want      string                                // relative to run ("" = an error)
		which     string                                // prefix
		wantError string
	}{
		{"a checkpoint folder", func(t *testing.T, run string) string {
			mk(t, filepath.Join(run, "ck"))
			return filepath.Join(run, "ck")
		}, "ck", "", ""},
		{"a checkpoint through a run's link", func(t *testing.T, run string) string {
			mk(t, filepath.Join(run, "checkpoints", "step-2"))
			link(t, "step-2", filepath.Join(run, "checkpoints", "last"))
			return filepath.Join(run, "checkpoints", "last")
		}, "checkpoints/last", "", ""},
		{"a run folder with best and last", func(t *testing.T, run string) string {
			mk(t, filepath.Join(run, "checkpoints", "step-2"))
			mk(t, filepath.Join(run, "checkpoints", "step-4"))
			link(t, "step-2", filepath.Join(run, "checkpoints", "best"))
			link(t, "step-4", filepath.Join(run, "checkpoints", "last"))
			os.WriteFile(filepath.Join(run, "checkpoints", "best.json"), []byte(`{"step":2,"checkpoint":"step-2","f1_well_formed":0.4875,"f1":0.5125}`), 0o644)
			return run
		}, "checkpoints/step-2", "best (step 2, validation F1 0.512, well-formed F1 0.487)", ""},
		{"a run folder without best (train.keep_best off, or an older run)", func(t *testing.T, run string) string {
			mk(t, filepath.Join(run, "checkpoints", "step-4"))
			link(t, "step-4", filepath.Join(run, "checkpoints", "last"))
			return run
		}, "checkpoints/step-4", "last", ""},
		{"a run folder with an absolute link", func(t *testing.T, run string) string {
			mk(t, filepath.Join(run, "checkpoints", "sft"))
			link(t, filepath.Join(run, "checkpoints", "sft"), filepath.Join(run, "checkpoints", "last"))
			return run
		}, "checkpoints/sft", "last", ""},
		{"a run folder without checkpoints yet", func(t *testing.T, run string) string {
			os.MkdirAll(filepath.Join(run, "checkpoints"), 0o755)
			return run
		}, "", "", "no checkpoint yet"},
		{"best naming an incomplete checkpoint", func(t *testing.T, run string) string {
			os.MkdirAll(filepath.Join(run, "checkpoints", "step-2"), 0o755)
			link(t, "step-2", filepath.Join(run, "checkpoints", "best"))
			return run
		}, "", "", "not a complete checkpoint"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			run := t.TempDir()
			arg := c.setup(t, run)
			got, which, err := ResolveCheckpoint(arg)
			if c.wantError != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantError) {
					t.Fatalf("ResolveCheckpoint(%s) = %q, %v; want an error saying %q", arg, got, err, c.wantError)
				}
				return
			}
			if err != nil || got != filepath.Join(run, c.want) || which != c.which {
				t.Fatalf("ResolveCheckpoint(%s) = %q, %q, %v; want %q, %q", arg, got, which, err, filepath.Join(run, c.want), c.which)
			}
		})
	}
}
