package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/recal-project/recal/cmd/recal/internal/preflight"
	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/internal/procgroup"
	"github.com/recal-project/recal/torchbridge"
	"github.com/recal-project/recal/trainer"
)

// configFlags are shared by the commands that read recal.toml.
func configFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "config", Value: "recal.toml", Usage: "configuration file (TOML; unknown keys are errors)"},
		&cli.StringSliceFlag{Name: "set", Usage: "override a config key: --set train.steps=10 (repeatable; dotted key names; a relative path is relative to the working directory, while paths in the file are relative to the file's folder)"},
	}
}

// loadConfig loads the command's configuration (config.Load: parsed,
// validated, paths resolved) and checks what it names against the files
// (preflight.Replay: a replayed pool's logs hold every question of
// [data]); either error is a usage error.
func loadConfig(cmd *cli.Command) (config.Config, error) {
	path := cmd.String("config")
	cfg, err := config.Load(path, cmd.StringSlice("set"))
	if err != nil {
		return cfg, usageError{err}
	}
	if err := preflight.Replay(cfg); err != nil {
		return cfg, usageError{fmt.Errorf("config: %s: %w", path, err)}
	}
	return cfg, nil
}

func trainCommand() *cli.Command {
	return &cli.Command{
		Name:  "train",
		Usage: "train a routing policy with GRPO and ReCal's calibrated advantages",
		Description: "Runs the optional supervised warm-up ([sft]), then GRPO ([train]) against the pool\n" +
			"([pool]) on the training questions ([data]), writing config.toml, metrics.jsonl,\n" +
			"rollouts.jsonl, validation.jsonl and checkpoints/ into the run folder.\n" +
			"SIGINT/SIGTERM save a checkpoint and exit with status 130 (a second one exits at once;\n" +
			"checkpoints/last stays loadable whenever recal stops); --resume continues.",
		Flags: append(configFlags(),
			&cli.StringFlag{Name: "run-dir", Usage: "run folder (default runs/<config name>)"},
			&cli.BoolFlag{Name: "dry-run", Usage: "check the config, checkpoint, data, pool and API keys, print a summary with a memory estimate and exit (0, or 2 listing every problem); loads and writes nothing"},
			&cli.BoolFlag{Name: "resume", Usage: "continue the run in --run-dir from checkpoints/last (or start it if it has none). " +
				"Refused when a key that changes what training computes differs from the run's: every key but policy.device/threads, " +
				"train.steps (unless train.lr_schedule decays over it)/log_every/checkpoint_every/validate_every/max_skipped_updates/micro_batch/head_chunk, [eval], [serve], data.test/test_per_dataset, " +
				"pool.cache/cache_dir/max_concurrency and the pool models' api_key_env, timeouts, concurrency, rate limits, retries and sim latency; " +
				"the error names each key with both values"},
			&cli.BoolFlag{Name: "allow-config-change", Usage: "with --resume: accept changed training keys; they take effect at the step after " +
				"the checkpoint, config.toml is kept, config-<step>.toml holds the new configuration and config-changes.jsonl records the change"},
			nprocFlag(),
		),
		Action: func(ctx context.Context, cmd *cli.Command) error {
			cfg, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			launch, err := rankLaunch(cmd)
			if err != nil {
				return err
			}
			world := max(launch.WorldSize, int(cmd.Int("nproc")))
			if world > 1 && cfg.Train.BatchSize%world != 0 {
				return usageError{fmt.Errorf("train: train.batch_size = %d questions do not split into whole groups over %d ranks: use a batch size divisible by the world size", cfg.Train.BatchSize, world)}
			}
			runDir := cmd.String("run-dir")
			if runDir == "" {
				name := strings.TrimSuffix(filepath.Base(cmd.String("config")), filepath.Ext(cmd.String("config")))
				runDir = filepath.Join("runs", name)
			}
			if cmd.Bool("dry-run") {
				return dryRunUntil(ctx, func() error {
					return dryRunTrain(os.Stdout, cfg, cmd.String("config"), runDir, cmd.Bool("resume"), world)
				})
			}
			if cmd.Bool("allow-config-change") && !cmd.Bool("resume") {
				return usageError{fmt.Errorf("train: --allow-config-change needs --resume")}
			}
			// Before the ranks start, so that they inherit the settings
			// rather than re-execute themselves.
			torchbridge.UseTrainingMalloc()
			if n := int(cmd.Int("nproc")); n > 1 {
				return launchLocal(ctx, n, cfg.Dist.Timeout)
			}
			if err := rankThreads(cmd, cfg.Policy.Threads, launch); err != nil {
				return err
			}
			device, err := trainer.RankDevice(cfg.Policy.Device, launch)
			if err != nil {
				return usageError{err}
			}
			group, err := joinRanks(ctx, launch, cmd, cfg.Dist.Timeout, func() (procgroup.Group, error) {
				return trainer.JoinGroup(ctx, launch, cfg.Dist, device)
			})
			if err != nil {
				return err
			}
			if group != nil {
				defer group.Close()
			}
			start := time.Now()
			err = trainer.Train(ctx, cfg.Training(), trainer.Options{RunDir: runDir, Resume: cmd.Bool("resume"),
				AllowConfigChange: cmd.Bool("allow-config-change"), Log: slog.Default(), Group: group, Device: device})
			if errors.Is(err, trainer.ErrInterrupted) {
				return exitError{code: 130, err: err}
			}
			if _, ok := errors.AsType[*trainer.ConfigMismatchError](err); ok {
				return usageError{err}
			}
			if err != nil {
				return err
			}
			if launch.Rank == 0 {
				slog.Info("training finished", "run_dir", runDir, "took", time.Since(start).Round(time.Second).String())
				fmt.Println(runDir)
			}
			return nil
		},
	}
}

// exitError carries a specific exit status.
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }
