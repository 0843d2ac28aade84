package trainer_test

import (
	"strings"
	"testing"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/internal/testing/testenv"
	"github.com/recal-project/recal/trainer"
)

// recal ablate and recal table1 reuse a finished run only when it was
// trained with the configuration they would train it with (a table must
// not name one configuration and report another's policy), and continue an
// unfinished one: they accept exactly the changes `recal train --resume`
// accepts (config.OperationalKeys), no more and no fewer. Their errors
// carry no command's name: each caller says its own.
func TestReuseAcceptsWhatResumeAccepts(t *testing.T) {
	// From the paper's constant schedule, under which more steps continue a
	// finished run (the offline default's cosine is the subtest below).
	cfg, err := config.Load("../recal.toml", []string{"train.lr_schedule=constant", "train.warmup_steps=0", "train.min_lr_ratio=0"})
	if err != nil {
		t.Fatal(err)
	}
	edit := func(f func(c *config.Config)) config.Config { c := cfg; f(&c); return c }
	cases := []struct {
		name     string
		cfg      config.Config
		step     int
		wantErr  string // "" = reused or continued
		finished bool
	}{
		{"same config, final step", cfg, 300, "", true},
		{"same config, earlier step (continued)", cfg, 120, "", false},
		{"more steps (continued)", edit(func(c *config.Config) { c.Train.Steps = 400 }), 300, "", false},
		{"other eval batch, serve address and threads", edit(func(c *config.Config) { c.Eval.Batch = 7; c.Serve.Addr = "0.0.0.0:1"; c.Policy.Threads = 3 }), 300, "", true},
		{"memory knobs, logging, checkpoint and validation cadence", edit(func(c *config.Config) {
			c.Train.MicroBatch, c.Train.HeadChunk, c.Train.LogEvery = 3, 64, 1
			c.Train.CheckpointEvery, c.Train.ValidateEvery, c.Train.MaxSkippedUpdates = 7, 9, 1
			c.Policy.RolloutWorkers = 2
		}), 300, "", true},
		{"evaluation's data, the pool's cache and concurrency, dist", edit(func(c *config.Config) {
			c.Data.Test, c.Data.TestPerDataset = []string{"nq"}, 3
			c.Pool.Cache, c.Pool.MaxConcurrency = "read-write", 5
			c.Dist.BucketBytes = 1 << 20
		}), 300, "", true},
		{"other calibration", edit(func(c *config.Config) { c.Calibration.Gating = false }), 300, "calibration.gating", false},
		{"other learning rate", edit(func(c *config.Config) { c.Train.LR = 1 }), 300, "train.lr", false},
		{"other training data", edit(func(c *config.Config) { c.Data.TrainPerDataset = 3 }), 300, "data.train_per_dataset", false},
		{"past the final step", edit(func(c *config.Config) { c.Train.Steps = 200 }), 300, "past train.steps", false},
	}
	// Under a decaying schedule train.steps sets every step's learning
	// rate: more steps do not continue a finished run.
	t.Run("more steps under a cosine schedule", func(t *testing.T) {
		cos := edit(func(c *config.Config) { c.Train.LRSchedule = "cosine" })
		d := t.TempDir()
		testenv.FakeRun(t, d, cos, 300)
		if err := trainer.TrainedAs(d, cos.Training()); err != nil {
			t.Fatalf("same config: %v", err)
		}
		longer := cos
		longer.Train.Steps = 400
		if err := trainer.TrainedAs(d, longer.Training()); err == nil || !strings.Contains(err.Error(), "train.steps: 300 in the run, 400 now") {
			t.Fatalf("error %v, want one naming train.steps with both values", err)
		}
	})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			testenv.FakeRun(t, dir, cfg, c.step)
			err := trainer.TrainedAs(dir, c.cfg.Training())
			if resumeErr := trainer.CheckResume(dir, c.cfg.Training()); (err == nil) != (resumeErr == nil) {
				t.Errorf("TrainedAs: %v; train --resume's check: %v; want both to accept or both to refuse", err, resumeErr)
			}
			var done bool
			if err == nil {
				done, err = trainer.Finished(dir, c.cfg.Train.Steps)
			}
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one naming %q", err, c.wantErr)
				}
				if strings.HasPrefix(err.Error(), "ablate") || strings.HasPrefix(err.Error(), "table1") {
					t.Errorf("error %q names a command: the caller (table1 or ablate) adds its own", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v; want the run reused or continued, as train --resume accepts it", err)
			}
			if done != c.finished {
				t.Errorf("finished = %v, want %v", done, c.finished)
			}
		})
	}
}
