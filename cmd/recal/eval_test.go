package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/recal-project/recal/config"
)

// recal ablate reuses a variant's finished run only when it was trained
// with the variant's configuration: otherwise the table would name one
// configuration and report another's policy.
func TestAblateReusesOnlyItsOwnRun(t *testing.T) {
	cfg, err := config.Load("../../recal.toml", nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := cfg.Write(filepath.Join(dir, "config.toml")); err != nil {
		t.Fatal(err)
	}
	last := filepath.Join(dir, "checkpoints", "last")
	if err := os.MkdirAll(last, 0o755); err != nil {
		t.Fatal(err)
	}
	state := func(step string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(last, "trainer_state.json"), []byte(`{"sft_done": true, "step": `+step+`}`), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	edit := func(f func(c *config.Config)) config.Config { c := cfg; f(&c); return c }
	cases := []struct {
		name     string
		cfg      config.Config
		step     string
		wantErr  string // "" = reused or continued
		finished bool
	}{
		{"same config, final step", cfg, "300", "", true},
		{"same config, earlier step (continued)", cfg, "120", "", false},
		{"more steps (continued)", edit(func(c *config.Config) { c.Train.Steps = 400 }), "300", "", false},
		{"other eval batch, serve address and threads", edit(func(c *config.Config) { c.Eval.Batch = 7; c.Serve.Addr = "0.0.0.0:1"; c.Policy.Threads = 3 }), "300", "", true},
		{"other calibration", edit(func(c *config.Config) { c.Calibration.Gating = false }), "300", "calibration.gating", false},
		{"other learning rate", edit(func(c *config.Config) { c.Train.LR = 1 }), "300", "train.lr", false},
		{"past the final step", edit(func(c *config.Config) { c.Train.Steps = 200 }), "300", "past train.steps", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			state(c.step)
			err := trainedAs(dir, c.cfg)
			var done bool
			if err == nil {
				done, err = finished(dir, c.cfg.Train.Steps)
			}
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one naming %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if done != c.finished {
				t.Errorf("finished = %v, want %v", done, c.finished)
			}
		})
	}
}
