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

	"github.com/recal-project/recal/ablate"
	"github.com/recal-project/recal/calibration"
	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/eval"
	"github.com/recal-project/recal/internal/runlock"
	"github.com/recal-project/recal/plot"
	"github.com/recal-project/recal/rollout"
	"github.com/recal-project/recal/torchbridge"
	"github.com/recal-project/recal/trainer"
)

func ablateCommand() *cli.Command {
	return &cli.Command{
		Name:  "ablate",
		Usage: "the ablation study: full ReCal, w/o LSC, w/o CAE, w/o DAO and w/o both, each trained with every seed, evaluated, tabulated as mean ± std over seeds",
		Description: "For each seed of --seeds: one supervised warm-up ([sft], train.seed = the seed) in\n" +
			"RUN_DIR/seed-N/warmup, shared by every variant (it does not depend on [calibration]),\n" +
			"then GRPO of each variant in RUN_DIR/seed-N/<variant>, continuing that warm-up exactly as\n" +
			"one `recal train` of warm-up + GRPO would; then each variant's checkpoints/best (else\n" +
			"checkpoints/last) is evaluated on --split. Writes ablation.{json,csv,md} (a row per\n" +
			"variant: EM per dataset, in-domain, out-of-domain and overall averages, mean ± sample\n" +
			"std over seeds; per-seed values in the JSON and CSV) and ablation_reward.{png,svg} (the\n" +
			"answer reward over steps per variant, mean over seeds, min–max band) into RUN_DIR.\n" +
			"Resumable: run it again after a kill and finished runs and evaluations are reused,\n" +
			"an interrupted one continues from its checkpoint. A run folder trained with another\n" +
			"configuration than `recal train --resume` accepts is refused, naming the keys.\n" +
			"--steps N shortens every variant's GRPO.",
		Flags: append(configFlags(),
			&cli.StringFlag{Name: "run-dir", Value: "runs/ablate", Usage: "study folder: seed-N/warmup, seed-N/<variant>, the table and the figure"},
			&cli.StringFlag{Name: "seeds", Usage: "comma-separated train.seed values, each a full set of runs (default: the config's train.seed alone)"},
			&cli.IntFlag{Name: "steps", Usage: "GRPO steps per variant (default: train.steps); said in the table's notes"},
			&cli.StringFlag{Name: "split", Value: "all", Usage: "test split of the table: id, ood or all"},
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
	seeds := []int64{cfg.Train.Seed}
	if cmd.IsSet("seeds") {
		if seeds, err = parseSeeds(cmd.String("seeds")); err != nil {
			return usageError{err}
		}
	}
	o := ablateOptions{Root: cmd.String("run-dir"), Seeds: seeds, Split: cmd.String("split"), Window: int(cmd.Int("window")),
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
	rep, err := runAblation(ctx, cfg, o)
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

// ablateOptions say where a study lives and what it covers.
type ablateOptions struct {
	Root   string
	Seeds  []int64
	Split  string   // test split (data.Split), also the eval-<split> folder of each run
	Window int      // the figure's moving average (0: plot.DefaultWindow)
	Notes  []string // said under the table
	Log    *slog.Logger
	// Progress, if set, follows each evaluation (progressFunc).
	Progress func(router string, done, total int)
	// variants are the rows (nil: ablate.Variants, all of them); tests
	// take fewer.
	variants []ablate.Variant
	// runDone, if set, is called after each variant's run is trained and
	// evaluated (tests stop the study there).
	runDone func(seed int64, variant string)
}

// ablateReport is what a study invocation did and made.
type ablateReport struct {
	Table   ablate.Table
	Figure  []string // the figure's files
	Trained []string // run folders this invocation trained or continued (none when all were done)
}

// runAblation runs the study: per seed, the shared warm-up, then every
// variant's GRPO and evaluation, each skipped when done; then the table and
// the figure in o.Root.
func runAblation(ctx context.Context, cfg config.Config, o ablateOptions) (ablateReport, error) {
	var rep ablateReport
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	names, err := data.Split(o.Split)
	if err != nil {
		return rep, usageError{err}
	}
	tc := cfg
	tc.Data.Test = names
	qs, err := tc.Data.LoadTest()
	if err != nil {
		return rep, err
	}
	// One study at a time in a folder: a second `recal ablate` on it stops
	// here, naming the holder (each run's own folder is locked by
	// trainer.Train as well).
	lock, err := runlock.Acquire(o.Root, "recal ablate")
	if err != nil {
		return rep, fmt.Errorf("ablate: study folder: %w", err)
	}
	defer lock.Release()
	variants := o.variants
	if variants == nil {
		variants = ablate.Variants
	}
	var results []ablate.Result
	var datasets []string
	runs := map[string][]string{} // variant → run folder per seed
	total, k := len(o.Seeds)*len(variants), 0
	for _, seed := range o.Seeds {
		if ctx.Err() != nil {
			return rep, trainer.ErrInterrupted
		}
		sc := cfg
		sc.Train.Seed = seed
		// The warm-up reads neither [calibration] nor train.steps: one per
		// seed serves every variant.
		warm := ""
		if sc.SFT.Steps > 0 {
			warm = ablate.WarmupDir(o.Root, seed)
			trained, err := ablationWarmup(ctx, ablate.WarmupConfig(sc), warm, log)
			if trained {
				rep.Trained = append(rep.Trained, warm)
			}
			if err != nil {
				return rep, err
			}
		}
		for _, v := range variants {
			k++
			if ctx.Err() != nil {
				return rep, trainer.ErrInterrupted
			}
			vc := sc
			edit, err := calibration.Ablation(v.Name)
			if err != nil {
				return rep, err
			}
			edit(&vc.Calibration)
			dir := ablate.VariantDir(o.Root, seed, v.Name)
			log.Info("ablation: run", "of", fmt.Sprintf("%d/%d", k, total), "variant", v.Name, "seed", seed, "run_dir", dir)
			trained, err := ablationRun(ctx, vc, dir, warm, log)
			if trained {
				rep.Trained = append(rep.Trained, dir)
			}
			if err != nil {
				return rep, err
			}
			em, ds, err := ablationEval(ctx, vc, dir, o.Split, qs, log, o.Progress)
			if err != nil {
				return rep, err
			}
			datasets = ds
			results = append(results, ablate.Result{Variant: v.Name, Seed: seed, EM: em})
			runs[v.Name] = append(runs[v.Name], dir)
			if o.runDone != nil {
				o.runDone(seed, v.Name)
			}
		}
	}
	if rep.Table, err = ablate.Summarize(results, datasets, o.Seeds, variants); err != nil {
		return rep, err
	}
	rep.Table.Notes = append(append([]string{}, o.Notes...),
		fmt.Sprintf("%d GRPO steps per variant; test split %s (up to %d questions per dataset); each run evaluated at checkpoints/best where it exists, else checkpoints/last.",
			cfg.Train.Steps, o.Split, cfg.Data.TestPerDataset))
	if err := rep.Table.Write(o.Root); err != nil {
		return rep, err
	}
	var curves []plot.Curves
	for _, v := range variants {
		curves = append(curves, plot.Curves{Label: v.Label, Runs: runs[v.Name]})
	}
	rep.Figure, err = plot.Options{Window: o.Window, Logger: log}.Ablation(curves, o.Root)
	return rep, err
}

// ablationWarmup trains a seed's supervised warm-up in dir (wc has
// train.steps = 0: the run ends at its checkpoints/sft) unless dir holds it
// already, trained with wc. It reports whether it trained.
func ablationWarmup(ctx context.Context, wc config.Config, dir string, log *slog.Logger) (bool, error) {
	if fileExists(filepath.Join(dir, "checkpoints", "last")) {
		// With no GRPO step the only checkpoint is the warm-up's.
		if err := trainedAs(dir, wc); err != nil {
			return false, fmt.Errorf("ablate: %w", err)
		}
		return false, nil
	}
	log.Info("ablation: supervised warm-up", "seed", wc.Train.Seed, "steps", wc.SFT.Steps, "run_dir", dir)
	// Resume also when no checkpoint exists yet: a warm-up stopped midway
	// starts again instead of being refused.
	if err := trainer.Train(ctx, wc, trainer.Options{RunDir: dir, Resume: true, Log: log}); err != nil {
		return true, err
	}
	if !fileExists(filepath.Join(dir, "checkpoints", "sft", "trainer_state.json")) {
		return true, fmt.Errorf("ablate: warm-up %s ended without checkpoints/sft", dir)
	}
	return true, nil
}

// ablationRun trains a variant's run in dir unless it is finished: a run
// folder with no checkpoint is seeded from the seed's warm-up (ablate.Seed;
// none when warm is "", sft.steps = 0) and continued, as is an interrupted
// run. It reports whether it trained.
func ablationRun(ctx context.Context, vc config.Config, dir, warm string, log *slog.Logger) (bool, error) {
	if fileExists(filepath.Join(dir, "checkpoints", "last")) {
		if err := trainedAs(dir, vc); err != nil {
			return false, fmt.Errorf("ablate: %w", err)
		}
		done, err := finished(dir, vc.Train.Steps)
		if err != nil {
			return false, fmt.Errorf("ablate: %w", err)
		}
		if done {
			return false, nil
		}
	} else if warm != "" {
		if err := ablate.Seed(dir, warm, vc); err != nil {
			return false, err
		}
	}
	return true, trainer.Train(ctx, vc, trainer.Options{RunDir: dir, Resume: true, Log: log})
}

// ablationEval evaluates a variant's policy (rollout.ResolveCheckpoint:
// checkpoints/best, else checkpoints/last) on qs into dir/eval-<split>;
// results of the same checkpoint and inputs are reused (eval.Run). It
// returns the exact match per dataset and the datasets in table order.
func ablationEval(ctx context.Context, vc config.Config, dir, split string, qs []data.Example, log *slog.Logger,
	progress func(string, int, int)) (map[string]float64, []string, error) {
	ck, _, err := rollout.ResolveCheckpoint(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("ablate: %w", err)
	}
	eng, err := rollout.OpenEngine(ck, torchbridge.Options{Device: vc.Policy.Device, DType: vc.Policy.DType})
	if err != nil {
		return nil, nil, fmt.Errorf("ablate: checkpoint %s: %w", ck, err)
	}
	defer eng.Close()
	train, val, err := vc.Data.LoadTrain()
	if err != nil {
		return nil, nil, err
	}
	env, err := rollout.NewEnv(vc, eng, rollout.AnswerBank(train, val, qs), log)
	if err != nil {
		return nil, nil, err
	}
	defer env.Close()
	s := eval.Setup{Env: env, Batch: vc.Eval.Batch, Seed: vc.Train.Seed, Pool: vc.Pool}
	out := filepath.Join(dir, "eval-"+split)
	t, err := eval.Run(ctx, s, qs, []string{"policy"}, out, log, progress)
	if err != nil {
		return nil, nil, err
	}
	if err := t.Write(out); err != nil {
		return nil, nil, err
	}
	em := map[string]float64{}
	for d, sc := range t.Rows[0].Datasets {
		em[d] = sc.EM
	}
	return em, t.Datasets, nil
}
