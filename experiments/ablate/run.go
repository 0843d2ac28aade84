package ablate

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/recal-project/recal/calibration"
	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/eval"
	"github.com/recal-project/recal/internal/plot"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/internal/runlock"
	"github.com/recal-project/recal/torchbridge"
	"github.com/recal-project/recal/trainer"
)

// Options say where a study lives and what it covers.
type Options struct {
	Root  string
	Seeds []int64
	Split string // the test selection's name: the eval-<split> folder of each run and the table's note
	// Datasets are the test datasets (nil: the split Split of the config's
	// data.test, data.Config.TestSplit).
	Datasets []string
	Window   int      // the figure's moving average (0: plot.DefaultWindow)
	Notes    []string // said under the table
	Log      *slog.Logger
	// Progress, if set, follows each evaluation (progressFunc).
	Progress func(router string, done, total int)
	// variants are the rows (nil: Variants, all of them); tests
	// take fewer.
	variants []Variant
	// runDone, if set, is called after each variant's run is trained and
	// evaluated (tests stop the study there).
	runDone func(seed int64, variant string)
}

// Report is what a study invocation did and made.
type Report struct {
	Table   Table
	Figure  []string // the figure's files
	Trained []string // run folders this invocation trained or continued (none when all were done)
}

// Run runs the study: per seed, the shared warm-up, then every
// variant's GRPO and evaluation, each skipped when done; then the table and
// the figure in o.Root.
func Run(ctx context.Context, cfg config.Config, o Options) (Report, error) {
	var rep Report
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	names := o.Datasets
	if names == nil {
		var err error
		if names, err = cfg.Data.TestSplit(o.Split); err != nil {
			return rep, fmt.Errorf("ablate: %w", err)
		}
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
		variants = Variants
	}
	var results []Result
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
			warm = WarmupDir(o.Root, seed)
			trained, err := warmup(ctx, WarmupConfig(sc), warm, log)
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
			dir := VariantDir(o.Root, seed, v.Name)
			log.Info("ablation: run", "of", fmt.Sprintf("%d/%d", k, total), "variant", v.Name, "seed", seed, "run_dir", dir)
			trained, err := trainVariant(ctx, vc, dir, warm, log)
			if trained {
				rep.Trained = append(rep.Trained, dir)
			}
			if err != nil {
				return rep, err
			}
			row, ds, err := evalVariant(ctx, vc, dir, o.Split, qs, log, o.Progress)
			if err != nil {
				return rep, err
			}
			datasets = ds
			em := map[string]float64{}
			for d, sc := range row.Datasets {
				em[d] = sc.EM
			}
			results = append(results, Result{Variant: v.Name, Seed: seed, EM: em, CostPerQuestion: row.CostPerQuestion})
			runs[v.Name] = append(runs[v.Name], dir)
			if o.runDone != nil {
				o.runDone(seed, v.Name)
			}
		}
	}
	if rep.Table, err = Summarize(results, datasets, cfg.Data.InDomain(), o.Seeds, variants); err != nil {
		return rep, err
	}
	refs, err := references(ctx, cfg, qs, filepath.Join(o.Root, "reference-"+o.Split), log, o.Progress)
	if err != nil {
		return rep, err
	}
	rep.Table.AddReferences(refs)
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

// warmup trains a seed's supervised warm-up in dir (wc has
// train.steps = 0: the run ends at its checkpoints/sft) unless dir holds it
// already, trained with wc. It reports whether it trained.
func warmup(ctx context.Context, wc config.Config, dir string, log *slog.Logger) (bool, error) {
	if exists(filepath.Join(dir, "checkpoints", "last")) {
		// With no GRPO step the only checkpoint is the warm-up's.
		if err := trainer.TrainedAs(dir, wc.Training()); err != nil {
			return false, fmt.Errorf("ablate: %w", err)
		}
		return false, nil
	}
	log.Info("ablation: supervised warm-up", "seed", wc.Train.Seed, "steps", wc.SFT.Steps, "run_dir", dir)
	// Resume also when no checkpoint exists yet: a warm-up stopped midway
	// starts again instead of being refused.
	if err := trainer.Train(ctx, wc.Training(), trainer.Options{RunDir: dir, Resume: true, Log: log}); err != nil {
		return true, err
	}
	if !exists(filepath.Join(dir, "checkpoints", "sft", "trainer_state.json")) {
		return true, fmt.Errorf("ablate: warm-up %s ended without checkpoints/sft", dir)
	}
	return true, nil
}

// trainVariant trains a variant's run in dir unless it is trainer.Finished: a run
// folder with no checkpoint is seeded from the seed's warm-up (Seed;
// none when warm is "", sft.steps = 0) and continued, as is an interrupted
// run. It reports whether it trained.
func trainVariant(ctx context.Context, vc config.Config, dir, warm string, log *slog.Logger) (bool, error) {
	if exists(filepath.Join(dir, "checkpoints", "last")) {
		if err := trainer.TrainedAs(dir, vc.Training()); err != nil {
			return false, fmt.Errorf("ablate: %w", err)
		}
		done, err := trainer.Finished(dir, vc.Train.Steps)
		if err != nil {
			return false, fmt.Errorf("ablate: %w", err)
		}
		if done {
			return false, nil
		}
	} else if warm != "" {
		if err := Seed(dir, warm, vc); err != nil {
			return false, err
		}
	}
	return true, trainer.Train(ctx, vc.Training(), trainer.Options{RunDir: dir, Resume: true, Log: log})
}

// references computes the study's reference rows (eval.References: the
// oracle, best and cheapest single model) on qs into dir, with a pool of
// its own; they depend on neither the variant nor the seed.
func references(ctx context.Context, cfg config.Config, qs []data.Example, dir string, log *slog.Logger,
	progress func(string, int, int)) ([]eval.Row, error) {
	train, val, err := cfg.Data.LoadTrain()
	if err != nil {
		return nil, err
	}
	env, err := rollout.NewEnv(cfg.Rollout(), nil, rollout.AnswerBank(train, val, qs), log)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	log.Info("ablation: the reference rows: every pool model asked every question", "models", len(env.Pool.Models()), "questions", len(qs), "dir", dir)
	s := eval.Setup{Env: env, Batch: cfg.Eval.Batch, Seed: cfg.Train.Seed, Pool: cfg.Pool, InDomain: cfg.Data.InDomain()}
	return eval.References(ctx, s, qs, dir, log, progress)
}

// evalVariant evaluates a variant's policy (rollout.ResolveCheckpoint:
// checkpoints/best, else checkpoints/last) on qs into dir/eval-<split>;
// results of the same checkpoint and inputs are reused (eval.Run). It
// returns the policy's row and the datasets in table order.
func evalVariant(ctx context.Context, vc config.Config, dir, split string, qs []data.Example, log *slog.Logger,
	progress func(string, int, int)) (eval.Row, []string, error) {
	ck, _, err := rollout.ResolveCheckpoint(dir)
	if err != nil {
		return eval.Row{}, nil, fmt.Errorf("ablate: %w", err)
	}
	eng, err := rollout.OpenEngine(ck, torchbridge.Options{Device: vc.Policy.Device, DType: vc.Policy.DType, EagerDecode: vc.Policy.EagerDecode})
	if err != nil {
		return eval.Row{}, nil, fmt.Errorf("ablate: checkpoint %s: %w", ck, err)
	}
	defer eng.Close()
	train, val, err := vc.Data.LoadTrain()
	if err != nil {
		return eval.Row{}, nil, err
	}
	env, err := rollout.NewEnv(vc.Rollout(), eng, rollout.AnswerBank(train, val, qs), log)
	if err != nil {
		return eval.Row{}, nil, err
	}
	defer env.Close()
	s := eval.Setup{Env: env, Batch: vc.Eval.Batch, Seed: vc.Train.Seed, Pool: vc.Pool, InDomain: vc.Data.InDomain()}
	out := filepath.Join(dir, "eval-"+split)
	t, err := eval.Run(ctx, s, qs, []string{"policy"}, out, log, progress)
	if err != nil {
		return eval.Row{}, nil, err
	}
	if err := t.Write(out); err != nil {
		return eval.Row{}, nil, err
	}
	return t.Rows[0], t.Datasets, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
