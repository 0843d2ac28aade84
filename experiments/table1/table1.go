package table1

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/eval"
	"github.com/recal-project/recal/eval/baselines"
	"github.com/recal-project/recal/eval/embed"
	"github.com/recal-project/recal/experiments/sftdirect"
	"github.com/recal-project/recal/internal/atomicfile"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/torchbridge"
	"github.com/recal-project/recal/trainer"
)

// Options are what Run makes and evaluates, and where.
type Options struct {
	Work       string
	Checkpoint string   // the ReCal policy
	Datasets   []string // test datasets
	Split      string   // their name (the results folder's)
	SFTSteps   int      // 0 = sft.steps
	R1Steps    int      // 0 = the ReCal run's train.steps (routerR1Steps)
	R1Start    string   // "" = the ReCal run's warm-up checkpoint, else policy.checkpoint
	Largest    string
	Selector   string
	KNNLog     string // "" = the ReCal run's rollouts.jsonl
	KNNK       int
	Log        *slog.Logger
	Progress   func(router string, done, total int)
}

// Report says what a Run made and how much it asked the pool.
type Report struct {
	Collected int      // (question, model) pairs asked by collect
	Made      []string // what was trained or fitted
	Calls     int64    // pool calls (collect and evaluation; training's own pools not counted)
	Took      map[string]time.Duration
}

func (r Report) String() string {
	made := "nothing trained or fitted (all reused)"
	if len(r.Made) > 0 {
		made = "made: " + strings.Join(r.Made, ", ")
	}
	var took []string
	for _, k := range slices.Sorted(maps.Keys(r.Took)) {
		took = append(took, fmt.Sprintf("%s %s", k, r.Took[k].Round(time.Second)))
	}
	return fmt.Sprintf("%s; collect asked %d pairs; %d pool calls; time: %s", made, r.Collected, r.Calls, strings.Join(took, ", "))
}

// Run makes what is missing and evaluates every row of Table 1.
func Run(ctx context.Context, cfg config.Config, o Options) (eval.PaperTable, Report, error) {
	rep := Report{Took: map[string]time.Duration{}}
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	timed := func(stage string, f func() error) error {
		t0 := time.Now()
		err := f()
		rep.Took[stage] += time.Since(t0)
		return err
	}
	// The ReCal policy and the knn routers' logged outcomes come from a
	// training run; nothing else can stand in for them. A run folder stands
	// for its checkpoints/best (else last), a checkpoint folder
	// (RUN/checkpoints/X) for itself.
	recalRun := filepath.Dir(filepath.Dir(filepath.Clean(o.Checkpoint)))
	ck, which, err := rollout.ResolveCheckpoint(o.Checkpoint)
	if err != nil {
		return eval.PaperTable{}, rep, fmt.Errorf("table1: --checkpoint: %w", err)
	}
	if which != "" {
		o.Log.Info("table1: the ReCal row evaluates the run's checkpoint", "picked", which, "checkpoint", ck)
		recalRun, o.Checkpoint = o.Checkpoint, ck
	}
	if _, err := os.Stat(filepath.Join(o.Checkpoint, "model.safetensors")); err != nil {
		return eval.PaperTable{}, rep, fmt.Errorf("table1: --checkpoint %s: no policy there; train one with `make train` or `recal train --config FILE --run-dir DIR` (its checkpoints/last)", o.Checkpoint)
	}
	if o.KNNLog == "" {
		o.KNNLog = filepath.Join(recalRun, "rollouts.jsonl")
	}
	if _, err := os.Stat(o.KNNLog); err != nil {
		return eval.PaperTable{}, rep, fmt.Errorf("table1: the knn rows need the logged outcomes of a training run (%s: %v); pass --knn-log RUN_DIR/rollouts.jsonl of a `recal train` run", o.KNNLog, err)
	}
	cfg.Data.Test = o.Datasets
	qs, err := cfg.Data.LoadTest()
	if err != nil {
		return eval.PaperTable{}, rep, err
	}

	// 1. The outcome matrix and the fitted routers.
	outcomes := filepath.Join(o.Work, "outcomes")
	routerDir := filepath.Join(o.Work, "routers")
	var fitted []string
	for _, r := range eval.Table1Rows {
		if slices.Contains(baselines.Names(), r.Router) {
			fitted = append(fitted, r.Router)
		}
	}
	if err := timed("collect", func() error {
		n, calls, err := collect(ctx, cfg, outcomes, o.Log)
		rep.Collected, rep.Calls = n, rep.Calls+calls
		if n > 0 {
			rep.Made = append(rep.Made, fmt.Sprintf("outcomes (%d pairs)", n))
		}
		return err
	}); err != nil {
		return eval.PaperTable{}, rep, err
	}
	if err := timed("fit", func() error {
		made, err := fit(ctx, cfg, outcomes, routerDir, fitted, o.Log)
		rep.Made = append(rep.Made, made...)
		return err
	}); err != nil {
		return eval.PaperTable{}, rep, err
	}

	// 2. The SFT-direct checkpoint.
	sftDir := filepath.Join(o.Work, "sft-direct")
	if err := timed("sft-direct", func() error {
		opt, err := sftDirectOptions(cfg, sftDir, o.SFTSteps)
		if err != nil {
			return err
		}
		opt.Log = o.Log
		spec, err := sftdirect.SpecOf(cfg, opt)
		if err != nil {
			return err
		}
		ok, err := sftdirect.Ready(sftDir, spec)
		if err != nil || ok {
			return err
		}
		o.Log.Info("table1: training the SFT-direct checkpoint", "out", sftDir, "steps", spec.Steps)
		rep.Made = append(rep.Made, "sft-direct")
		return sftdirect.Train(ctx, cfg, opt)
	}); err != nil {
		return eval.PaperTable{}, rep, err
	}

	// 3. The Router-R1 policy: PPO, with ReCal's step budget.
	r1Dir := filepath.Join(o.Work, "router-r1")
	if err := timed("router-r1", func() error {
		made, err := routerR1(ctx, cfg, r1Dir, recalRun, o)
		if made {
			rep.Made = append(rep.Made, "router-r1")
		}
		return err
	}); err != nil {
		return eval.PaperTable{}, rep, err
	}

	// 4. Every row, each into its own results folder, with the policy it
	// runs opened for its rows and closed after the last.
	out := filepath.Join(o.Work, "eval-"+o.Split)
	checkpoints, err := policies(cfg, o.Checkpoint, r1Dir, o.Log)
	if err != nil {
		return eval.PaperTable{}, rep, err
	}
	last := map[string]int{}
	for i, r := range eval.Table1Rows {
		if r.Router != "" {
			last[r.Policy] = i
		}
	}
	setups := map[string]*rowSetup{}
	defer func() {
		for _, s := range setups {
			s.close()
		}
	}()
	t := eval.PaperTable{Split: o.Split, InDomain: cfg.Data.InDomain()}
	// The reference rows (oracle, best and cheapest single model): every
	// pool model asked every question, with a pool of its own.
	err = timed("reference", func() error {
		refs, calls, err := references(ctx, cfg, qs, filepath.Join(out, "reference"), o)
		rep.Calls += calls
		t.References = refs
		return err
	})
	if err != nil {
		return eval.PaperTable{}, rep, err
	}
	err = timed("evaluate", func() error {
		for i, r := range eval.Table1Rows {
			row := eval.PaperRow{Group: r.Group, Label: r.Label, Router: r.Router}
			if r.NotRun != "" {
				row.Status = "not run: " + r.NotRun
				t.Rows = append(t.Rows, row)
				continue
			}
			s, ok := setups[r.Policy]
			if !ok {
				var err error
				if s, err = openSetup(cfg, checkpoints[r.Policy], qs, o); err != nil {
					return fmt.Errorf("table1: row %s: %w", r.Label, err)
				}
				setups[r.Policy] = s
			}
			s.setup.RouterDir, s.setup.SFTCheckpoint = routerDir, sftDir
			if r.Policy != "" {
				row.Policy = checkpoints[r.Policy]
			}
			o.Log.Info("table1: evaluating", "row", r.Label, "router", r.Router, "questions", len(qs))
			before := s.setup.Env.Pool.Usage()
			tab, err := eval.Run(ctx, s.setup, qs, []string{r.Router}, filepath.Join(out, r.Slug()), o.Log, o.Progress)
			for _, u := range s.setup.Env.Pool.Usage().Sub(before) {
				rep.Calls += u.Calls
			}
			if err != nil {
				return fmt.Errorf("table1: row %s: %w", r.Label, err)
			}
			row.Scores = &tab.Rows[0]
			t.Datasets = tab.Datasets
			t.Rows = append(t.Rows, row)
			if last[r.Policy] == i {
				s.close()
				delete(setups, r.Policy)
			}
		}
		return nil
	})
	if err != nil {
		return eval.PaperTable{}, rep, err
	}
	if err := t.Write(out); err != nil {
		return eval.PaperTable{}, rep, err
	}
	return t, rep, nil
}

// policies maps each policy of eval.Table1Rows to the checkpoint its
// rows run: policy.checkpoint for the base policy, recal (--checkpoint,
// already resolved) for ReCal and the direct routers, and for Router-R1 its
// run r1Dir resolved by the same rule as --checkpoint
// (rollout.ResolveCheckpoint: checkpoints/best, else checkpoints/last), so
// that neither RL row is evaluated at another point of its run.
func policies(cfg config.Config, recal, r1Dir string, log *slog.Logger) (map[string]string, error) {
	r1, which, err := rollout.ResolveCheckpoint(r1Dir)
	if err != nil {
		return nil, fmt.Errorf("table1: router-r1: %w", err)
	}
	log.Info("table1: the Router-R1 row evaluates the run's checkpoint", "picked", which, "checkpoint", r1)
	return map[string]string{eval.PolicyBase: cfg.Policy.Checkpoint, eval.PolicyReCal: recal,
		eval.PolicyRouterR1: r1, "": recal}, nil
}

// references computes the reference rows of qs into dir
// (eval.References) and returns them and the pool calls made.
func references(ctx context.Context, cfg config.Config, qs []data.Example, dir string, o Options) ([]eval.Row, int64, error) {
	train, val, err := cfg.Data.LoadTrain()
	if err != nil {
		return nil, 0, err
	}
	env, err := rollout.NewEnv(cfg.Rollout(), nil, rollout.AnswerBank(train, val, qs), o.Log)
	if err != nil {
		return nil, 0, err
	}
	defer env.Close()
	o.Log.Info("table1: the reference rows: every pool model asked every question", "models", len(env.Pool.Models()), "questions", len(qs))
	s := eval.Setup{Env: env, Batch: cfg.Eval.Batch, Seed: cfg.Train.Seed, Pool: cfg.Pool, InDomain: cfg.Data.InDomain()}
	refs, err := eval.References(ctx, s, qs, dir, o.Log, o.Progress)
	var calls int64
	for _, u := range env.Pool.Usage() {
		calls += u.Calls
	}
	return refs, calls, err
}

// rowSetup is an evaluation setup with the policy and pool it opened.
type rowSetup struct {
	setup eval.Setup
	close func()
}

// openSetup opens checkpoint ck and a pool for evaluating qs.
func openSetup(cfg config.Config, ck string, qs []data.Example, o Options) (*rowSetup, error) {
	eng, err := rollout.OpenEngine(ck, torchbridge.Options{Device: cfg.Policy.Device, DType: cfg.Policy.DType, EagerDecode: cfg.Policy.EagerDecode})
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s is not a policy: %w", ck, err)
	}
	train, val, err := cfg.Data.LoadTrain()
	if err != nil {
		eng.Close()
		return nil, err
	}
	env, err := rollout.NewEnv(cfg.Rollout(), eng, rollout.AnswerBank(train, val, qs), o.Log)
	if err != nil {
		eng.Close()
		return nil, err
	}
	s := eval.Setup{Env: env, Batch: cfg.Eval.Batch, Seed: cfg.Train.Seed, Largest: o.Largest, Selector: o.Selector,
		KNNLog: o.KNNLog, KNNK: o.KNNK, Pool: cfg.Pool, Embedding: cfg.Embedding, EmbeddingCache: embed.CacheDir(cfg.Pool.CacheDir),
		InDomain: cfg.Data.InDomain()}
	return &rowSetup{setup: s, close: func() { env.Close(); eng.Close() }}, nil
}

// collect asks the pool what the outcome folder lacks (as recal
// collect does: the training split, wrong answers drawn from every
// training file's golden answers) and returns the pairs asked and the pool
// calls made.
func collect(ctx context.Context, cfg config.Config, dir string, log *slog.Logger) (int, int64, error) {
	train, _, err := cfg.Data.LoadTrain()
	if err != nil {
		return 0, 0, err
	}
	all := cfg.Data
	all.TrainPerDataset = 0
	full, val, err := all.LoadTrain()
	if err != nil {
		return 0, 0, err
	}
	bank := rollout.AnswerBank(full, val)
	pool, err := llmpool.New(cfg.Pool, llmpool.WithLogger(log), llmpool.WithAnswerBank(bank))
	if err != nil {
		return 0, 0, err
	}
	defer pool.Close()
	info, err := baselines.PoolIdentity(cfg.Pool, bank)
	if err != nil {
		return 0, 0, err
	}
	st, err := baselines.Collect(ctx, dir, baselines.CollectOptions{Pool: pool, Info: info, Questions: train,
		Extract: eval.ExtractAnswer, Log: log})
	var calls int64
	for _, u := range pool.Usage() {
		calls += u.Calls
	}
	if err == nil && st.Failed > 0 {
		err = fmt.Errorf("table1: collect: %d calls failed; run table1 again to ask them again", st.Failed)
	}
	return st.Asked, calls, err
}

// fitStamp is what a fitted router of the work folder was fitted from.
type fitStamp struct {
	Matrix    string           `json:"matrix"`
	Baselines baselines.Config `json:"baselines"`
	Embedding json.RawMessage  `json:"embedding"`
	Seed      int64            `json:"seed"`
}

// fit fits each router of names whose folder in routerDir is missing
// or was fitted from other inputs, and returns the ones it fitted.
func fit(ctx context.Context, cfg config.Config, outcomes, routerDir string, names []string, log *slog.Logger) ([]string, error) {
	if len(names) == 0 {
		return nil, nil
	}
	m, err := baselines.LoadMatrix(outcomes)
	if err != nil {
		return nil, err
	}
	emb, err := json.Marshal(cfg.Embedding)
	if err != nil {
		return nil, fmt.Errorf("table1: %w", err)
	}
	stamp, err := json.MarshalIndent(fitStamp{Matrix: m.Digest, Baselines: cfg.Baselines, Embedding: emb, Seed: cfg.Train.Seed}, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("table1: %w", err)
	}
	var made []string
	for _, name := range names {
		dir := filepath.Join(routerDir, name)
		stampPath := filepath.Join(routerDir, name+".fit.json")
		if was, err := os.ReadFile(stampPath); err == nil && bytes.Equal(was, stamp) {
			if _, err := baselines.Digest(dir); err == nil {
				continue
			}
		}
		embedder, err := embed.New(cfg.Embedding, embed.WithLogger(slog.Default()), embed.WithCacheDir(embed.CacheDir(cfg.Pool.CacheDir)))
		if err != nil {
			return made, err
		}
		log.Info("table1: fitting", "router", name, "questions", len(m.Questions))
		r, err := baselines.Fit(ctx, name, cfg.Baselines, m, embedder, cfg.Train.Seed)
		if err != nil {
			return made, err
		}
		if err := r.Save(dir); err != nil {
			return made, err
		}
		if err := atomicfile.Write(stampPath, func(w io.Writer) error { _, err := w.Write(stamp); return err }); err != nil {
			return made, err
		}
		made = append(made, name)
	}
	return made, nil
}

// routerR1 trains the Router-R1 row's policy in dir unless it holds
// a trainer.Finished run of the same configuration: Router-R1's PPO
// (train.algorithm = "ppo", its KL weighed by ppo.kl_coef) for o.R1Steps
// steps (0: as many as the ReCal run, routerR1Steps), starting from
// o.R1Start, else from the ReCal run's warm-up checkpoint (checkpoints/sft)
// with no warm-up of its own, else from policy.checkpoint with the [sft]
// warm-up. It reports whether it trained.
func routerR1(ctx context.Context, cfg config.Config, dir, recalRun string, o Options) (bool, error) {
	rc := cfg
	rc.Train.Algorithm = "ppo"
	steps, err := routerR1Steps(cfg, recalRun, o)
	if err != nil {
		return false, err
	}
	rc.Train.Steps = steps
	start := o.R1Start
	if start == "" {
		if sft := filepath.Join(recalRun, "checkpoints", "sft"); exists(filepath.Join(sft, "model.safetensors")) {
			start = sft
		}
	}
	if start != "" {
		rc.Policy.Checkpoint, rc.SFT.Steps = start, 0
	}
	if err := rc.Validate(); err != nil {
		return false, fmt.Errorf("table1: router-r1: %w", err)
	}
	// The starting weights' digest: the path alone (checkpoints/sft of a
	// run made again) does not say which weights Router-R1 started from.
	startID, err := eval.CheckpointDigest(rc.Policy.Checkpoint)
	if err != nil {
		return false, fmt.Errorf("table1: router-r1: %w", err)
	}
	stamp := filepath.Join(dir, "start.digest")
	resume := exists(filepath.Join(dir, "checkpoints", "last"))
	if resume {
		if was, err := os.ReadFile(stamp); err != nil || string(was) != startID {
			return false, fmt.Errorf("table1: router-r1: %s was trained from other starting weights than %s; remove it to train it again", dir, rc.Policy.Checkpoint)
		}
		if err := trainer.TrainedAs(dir, rc.Training()); err != nil {
			return false, fmt.Errorf("table1: router-r1: %w", err)
		}
		done, err := trainer.Finished(dir, rc.Train.Steps)
		if err != nil {
			return false, fmt.Errorf("table1: router-r1: %w", err)
		}
		if done {
			return false, nil
		}
	}
	o.Log.Info("table1: training Router-R1 (PPO)", "run_dir", dir, "steps", rc.Train.Steps, "from", rc.Policy.Checkpoint, "resume", resume)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("table1: %w", err)
	}
	if err := atomicfile.Write(stamp, func(w io.Writer) error { _, err := io.WriteString(w, startID); return err }); err != nil {
		return false, err
	}
	// Resume also when no checkpoint exists yet: a run stopped before its
	// first checkpoint starts again instead of being refused.
	return true, trainer.Train(ctx, rc.Training(), trainer.Options{RunDir: dir, Resume: true, Log: o.Log})
}

// routerR1Steps is the Router-R1 row's PPO step count: o.R1Steps, else the
// ReCal row's budget, train.steps of the configuration its run last trained
// with (trainer.RunConfigFile), else, for a checkpoint outside a run, train.steps
// of cfg.
func routerR1Steps(cfg config.Config, recalRun string, o Options) (int, error) {
	if o.R1Steps > 0 {
		return o.R1Steps, nil
	}
	path, err := trainer.RunConfigFile(recalRun)
	if err != nil {
		return 0, fmt.Errorf("table1: router-r1: the ReCal run's step count: %w", err)
	}
	if path == "" {
		o.Log.Info("table1: Router-R1 trains train.steps of the configuration: the ReCal checkpoint's run has no config.toml", "steps", cfg.Train.Steps)
		return cfg.Train.Steps, nil
	}
	rc, err := config.ReadRunFile(path)
	if err != nil {
		return 0, fmt.Errorf("table1: router-r1: the ReCal run's step count: %w", err)
	}
	if rc.Train.Steps < 1 {
		return 0, fmt.Errorf("table1: router-r1: the ReCal run's %s has train.steps = %d, no RL step to match; pass --r1-steps", path, rc.Train.Steps)
	}
	o.Log.Info("table1: Router-R1 trains as many steps as the ReCal run", "steps", rc.Train.Steps, "from", path)
	return rc.Train.Steps, nil
}

// sftDirectOptions are the options of the SFT-direct fit of cfg into out
// (recal train-sft-direct's; steps 0 = sft.steps).
func sftDirectOptions(cfg config.Config, out string, steps int) (sftdirect.Options, error) {
	if steps < 0 {
		return sftdirect.Options{}, fmt.Errorf("train-sft-direct: --steps %d: want ≥ 0", steps)
	}
	if steps == 0 && cfg.SFT.Steps == 0 {
		return sftdirect.Options{}, fmt.Errorf("train-sft-direct: sft.steps is 0 and no --steps given: nothing to fit")
	}
	base, err := eval.CheckpointDigest(cfg.Policy.Checkpoint)
	if err != nil {
		return sftdirect.Options{}, fmt.Errorf("train-sft-direct: policy.checkpoint: %w", err)
	}
	return sftdirect.Options{Out: out, Steps: steps, BaseID: base, Log: slog.Default()}, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
