package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/recal-project/recal/experiments/ablate"
	"github.com/recal-project/recal/torchbridge"
)

// recal ablate: package ablate runs the study (its doc lists the study
// folder); this file parses the flags.

func ablateCommand() *cli.Command {
	return &cli.Command{
		Name:  "ablate",
		Usage: "the ablation study: full ReCal, w/o LSC, w/o CAE, w/o DAO and w/o both, each trained with every seed, evaluated, tabulated as mean ± std over seeds",
		Description: "For each seed of --seeds: one supervised warm-up ([sft], train.seed = the seed) in\n" +
			"RUN_DIR/seed-N/warmup, shared by every variant (it does not depend on [calibration]),\n" +
			"then GRPO of each variant in RUN_DIR/seed-N/<variant>, continuing that warm-up exactly as\n" +
			"one `recal train` of warm-up + GRPO would; then each variant's checkpoints/best (else\n" +
			"checkpoints/last) is evaluated on --split of data.test (or --datasets). Writes\n" +
			"ablation.{json,csv,md} (a row per variant: EM per dataset, in-domain (data.train's),\n" +
			"out-of-domain and overall averages and cost per question, mean ± sample std over seeds;\n" +
			"per-seed values in the JSON and CSV; then the reference rows: the oracle, best and\n" +
			"cheapest single pool model, every pool model asked every question into\n" +
			"RUN_DIR/reference-<split>) and ablation_reward.{png,svg} (the\n" +
			"answer reward over steps per variant, mean over seeds, min–max band) into RUN_DIR.\n" +
			"Resumable: run it again after a kill and finished runs and evaluations are reused,\n" +
			"an interrupted one continues from its checkpoint. A run folder trained with another\n" +
			"configuration than `recal train --resume` accepts is refused, naming the keys.\n" +
			"--steps N shortens every variant's GRPO.",
		Flags: append(configFlags(),
			&cli.StringFlag{Name: "run-dir", Value: "runs/ablate", Usage: "study folder: seed-N/warmup, seed-N/<variant>, the table and the figure"},
			&cli.StringFlag{Name: "seeds", Usage: "comma-separated train.seed values, each a full set of runs (default: the config's train.seed alone)"},
			&cli.IntFlag{Name: "steps", Usage: "GRPO steps per variant (default: train.steps); said in the table's notes"},
			splitFlag(false),
			datasetsFlag(),
			&cli.IntFlag{Name: "window", Usage: "moving average of the figure, in logged steps (default 10; 1 = none)"},
		),
		Action: runAblate,
	}
}

func runAblate(ctx context.Context, cmd *cli.Command) error {
	torchbridge.UseTrainingMalloc()
	cfg, err := loadConfig(cmd)
	if err != nil {
		return err
	}
	if err := setThreadsFrom(cmd, cfg.Policy.Threads); err != nil {
		return err
	}
	names, sel, err := evalSelection(cmd, cfg, false)
	if err != nil {
		return err
	}
	seeds := []int64{cfg.Train.Seed}
	if cmd.IsSet("seeds") {
		if seeds, err = parseSeeds(cmd.String("seeds")); err != nil {
			return usageError{err}
		}
	}
	o := ablate.Options{Root: cmd.String("run-dir"), Seeds: seeds, Split: sel, Datasets: names, Window: int(cmd.Int("window")),
		Log: slog.Default(), Progress: progressFunc()}
	if o.Window < 0 {
		return usageError{fmt.Errorf("--window %d: must be ≥ 0", o.Window)}
	}
	if cmd.IsSet("steps") {
		n := int(cmd.Int("steps"))
		if n < 1 {
			return usageError{fmt.Errorf("--steps %d: must be ≥ 1", n)}
		}
		if n != cfg.Train.Steps {
			o.Notes = append(o.Notes, fmt.Sprintf("Shortened study: %d GRPO steps per variant (--steps), not the config's train.steps = %d.", n, cfg.Train.Steps))
		}
		cfg.Train.Steps = n
	}
	start := time.Now()
	rep, err := ablate.Run(ctx, cfg, o)
	if err != nil {
		return err
	}
	rep.Table.Text(os.Stdout)
	for _, f := range []string{"ablation.json", "ablation.csv", "ablation.md"} {
		fmt.Println(filepath.Join(o.Root, f))
	}
	for _, f := range rep.Figure {
		fmt.Println(f)
	}
	slog.Info("ablation done", "runs_trained", len(rep.Trained), "took", time.Since(start).Round(time.Second).String())
	return nil
}

// parseSeeds reads --seeds: comma-separated integers, no repeats.
func parseSeeds(s string) ([]int64, error) {
	var out []int64
	seen := map[int64]bool{}
	for _, p := range splitList(s) {
		v, err := strconv.ParseInt(p, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("--seeds: %q is not an integer", p)
		}
		if seen[v] {
			return nil, fmt.Errorf("--seeds: %d given twice", v)
		}
		seen[v] = true
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--seeds: no seed in %q", s)
	}
	return out, nil
}
