package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/urfave/cli/v3"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/dist"
	"github.com/recal-project/recal/eval"
	"github.com/recal-project/recal/rollout"
	"github.com/recal-project/recal/torchbridge"
	"github.com/recal-project/recal/trainer"
)

const defaultRouters = "policy,direct,largest,random,prompt,knn"

func evalFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "split", Value: "all", Usage: "test split: id (nq, hotpotqa), ood (the other five) or all"},
		&cli.StringFlag{Name: "datasets", Usage: "comma-separated datasets (instead of --split)"},
		&cli.StringFlag{Name: "routers", Value: defaultRouters, Usage: "comma-separated routers: " + strings.Join(eval.RouterNames(), ", ")},
		&cli.StringFlag{Name: "extra-models", Usage: "TOML file of [[models]] added to the pool at evaluation only (unseen models)"},
		&cli.StringFlag{Name: "largest", Usage: "pool model of the largest router (default: highest output price)"},
		&cli.StringFlag{Name: "selector", Usage: "pool model the prompt router asks (default: the largest)"},
		&cli.StringFlag{Name: "knn-log", Usage: "rollouts.jsonl of a training run for the knn router (default: the checkpoint's run)"},
		&cli.IntFlag{Name: "knn-k", Value: 10, Usage: "neighbours of the knn router"},
		&cli.StringFlag{Name: "router-dir", Usage: "folder of the fitted baseline routers (mlp, routellm-mf, routerdc, graphrouter), one sub-folder each, made by recal fit"},
		&cli.StringFlag{Name: "sft-checkpoint", Usage: "checkpoint of the sft router, made by recal train-sft-direct"},
		&cli.StringFlag{Name: "cot-template", Usage: "prompt template of the cot router (default: " + eval.CoTTemplateName + " beside router.prompt_template)"},
	}
}

func evalCommand() *cli.Command {
	return &cli.Command{
		Name:  "eval",
		Usage: "evaluate a policy checkpoint and baseline routers on the test sets (EM, F1, calls, cost)",
		Description: "Greedy decoding over up to data.test_per_dataset questions per dataset. Prints the\n" +
			"table and writes table.{json,csv,md} and results-<router>.jsonl into --out; rerunning\n" +
			"with the same --out finishes an interrupted evaluation without redoing what was done.\n" +
			"A results file of other inputs (another checkpoint's weights, pool or settings) is\n" +
			"moved aside to results-<router>.<id>.jsonl (and taken back when those inputs return),\n" +
			"never mixed in. --dry-run checks everything first and writes nothing.",
		Flags: append(append(configFlags(),
			&cli.StringFlag{Name: "checkpoint", Usage: "policy checkpoint folder, or a training run folder: its checkpoints/best, else checkpoints/last (required for the policy and direct routers)"},
			&cli.StringFlag{Name: "out", Usage: "output folder (default <checkpoint>/../../eval-<split>, or runs/eval-<split>)"},
			&cli.BoolFlag{Name: "dry-run", Usage: "check the config, checkpoint, data, pool and API keys, print a summary and exit (0, or 2 listing every problem); loads and writes nothing"},
			nprocFlag(),
		), evalFlags()...),
		Action: runEval,
	}
}

// evalSelection names the test datasets of --split or --datasets, and the
// selection's name for the default --out.
func evalSelection(cmd *cli.Command) ([]string, string, error) {
	sel := cmd.String("split")
	names, err := data.Split(sel)
	if cmd.IsSet("datasets") {
		sel = strings.ReplaceAll(cmd.String("datasets"), ",", "+")
		names, err = data.Expand(strings.Split(cmd.String("datasets"), ","))
	}
	if err != nil {
		return nil, "", usageError{err}
	}
	return names, sel, nil
}

// evalQuestions loads the test questions of --split or --datasets.
func evalQuestions(cmd *cli.Command, cfg config.Config) ([]data.Example, string, error) {
	names, sel, err := evalSelection(cmd)
	if err != nil {
		return nil, "", err
	}
	cfg.Data.Test = names
	qs, err := cfg.Data.LoadTest()
	return qs, sel, err
}

// evalOut is --out, or its default: eval-<selection> in the run folder of
// the checkpoint (…/run/checkpoints/step-N), else runs/eval-<selection>.
func evalOut(cmd *cli.Command, checkpoint, sel string) string {
	if out := cmd.String("out"); out != "" {
		return out
	}
	run := filepath.Dir(filepath.Dir(filepath.Clean(checkpoint)))
	if !fileExists(filepath.Join(run, "config.toml")) {
		return filepath.Join("runs", "eval-"+sel)
	}
	return filepath.Join(run, "eval-"+sel)
}

// knnLogOf is --knn-log, or the rollouts.jsonl of the checkpoint's run ("" if none).
func knnLogOf(cmd *cli.Command, checkpoint string) string {
	if p := cmd.String("knn-log"); p != "" {
		return p
	}
	if guess := filepath.Join(filepath.Dir(filepath.Dir(filepath.Clean(checkpoint))), "rollouts.jsonl"); fileExists(guess) {
		return guess
	}
	return ""
}

// evalSetup opens the policy and the pool (with the extra models).
func evalSetup(cmd *cli.Command, cfg config.Config, checkpoint string, qs []data.Example) (eval.Setup, func(), error) {
	if p := cmd.String("extra-models"); p != "" {
		extra, err := eval.LoadExtraModels(p)
		if err != nil {
			return eval.Setup{}, nil, usageError{err}
		}
		cfg.Pool.Models = append(cfg.Pool.Models, extra...)
		if err := cfg.Pool.Validate(); err != nil {
			return eval.Setup{}, nil, usageError{fmt.Errorf("%s: %w", p, err)}
		}
	}
	eng, err := rollout.OpenEngine(checkpoint, torchbridge.Options{Device: cfg.Policy.Device, DType: cfg.Policy.DType})
	if err != nil {
		return eval.Setup{}, nil, fmt.Errorf("checkpoint %s is not a policy: %w", checkpoint, err)
	}
	train, val, err := cfg.Data.LoadTrain()
	if err != nil {
		eng.Close()
		return eval.Setup{}, nil, err
	}
	env, err := rollout.NewEnv(cfg, eng, rollout.AnswerBank(train, val, qs), slog.Default())
	if err != nil {
		eng.Close()
		return eval.Setup{}, nil, err
	}
	knnLog := knnLogOf(cmd, checkpoint)
	s := eval.Setup{Env: env, Batch: cfg.Eval.Batch, Seed: cfg.Train.Seed, Largest: cmd.String("largest"),
		Selector: cmd.String("selector"), KNNLog: knnLog, KNNK: int(cmd.Int("knn-k")), Pool: cfg.Pool,
		SFTCheckpoint: cmd.String("sft-checkpoint"), CoTTemplate: cmd.String("cot-template"),
		RouterDir: cmd.String("router-dir"), Embedding: cfg.Embedding, EmbeddingCache: embeddingCache(cfg)}
	return s, func() { env.Close(); eng.Close() }, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func runEval(ctx context.Context, cmd *cli.Command) error {
	if err := requireFlags(cmd, "checkpoint"); err != nil {
		return err
	}
	cfg, err := loadConfig(cmd)
	if err != nil {
		return err
	}
	routers := splitList(cmd.String("routers"))
	for _, r := range routers {
		if _, ok := eval.Routers[r]; !ok {
			return usageError{fmt.Errorf("--routers: unknown router %q (known: %s)", r, strings.Join(eval.RouterNames(), ", "))}
		}
	}
	// A run folder stands for its best checkpoint (train.keep_best), else its last.
	ck, which, err := rollout.ResolveCheckpoint(cmd.String("checkpoint"))
	if err != nil {
		return usageError{fmt.Errorf("--checkpoint: %w", err)}
	}
	if which != "" {
		slog.Info("evaluating the run's checkpoint", "picked", which, "checkpoint", ck)
	}
	if cmd.Bool("dry-run") {
		names, sel, err := evalSelection(cmd)
		if err != nil {
			return err
		}
		cfg.Data.Test = names
		return dryRunEval(os.Stdout, cfg, cmd.String("config"), ck, evalChoices{routers: routers, routersSet: cmd.IsSet("routers"),
			extraModels: cmd.String("extra-models"), largest: cmd.String("largest"), selector: cmd.String("selector"),
			knnLog: knnLogOf(cmd, ck), out: evalOut(cmd, ck, sel), routerDir: cmd.String("router-dir"),
			sftCheckpoint: cmd.String("sft-checkpoint"), cotTemplate: cmd.String("cot-template")})
	}
	qs, sel, err := evalQuestions(cmd, cfg)
	if err != nil {
		return err
	}
	launch, err := rankLaunch(cmd)
	if err != nil {
		return err
	}
	if n := int(cmd.Int("nproc")); n > 1 {
		return launchLocal(ctx, n, cfg.Dist.Timeout)
	}
	if err := rankThreads(cmd, cfg.Policy.Threads, launch); err != nil {
		return err
	}
	// Each rank: its own GPU (policy.device = "cuda") and its share of the
	// pool's global limits.
	if cfg.Policy.Device, err = trainer.RankDevice(cfg.Policy.Device, launch); err != nil {
		return usageError{err}
	}
	cfg.Pool = trainer.SharePool(cfg.Pool, launch.Rank, launch.WorldSize, slog.Default())
	group, err := joinRanks(ctx, launch, cmd, cfg.Dist.Timeout, func() (dist.Group, error) {
		return trainer.JoinGroup(ctx, launch, cfg.Dist, cfg.Policy.Device)
	})
	if err != nil {
		return err
	}
	if group != nil {
		defer group.Close()
	}
	s, closeAll, err := evalSetup(cmd, cfg, ck, qs)
	if err != nil {
		return err
	}
	defer closeAll()
	s.Group = group
	if s.KNNLog == "" && slices.Contains(routers, "knn") && !cmd.IsSet("routers") {
		routers = slices.DeleteFunc(routers, func(r string) bool { return r == "knn" }) // no logged outcomes to route by
		slog.Warn("router knn skipped: no --knn-log and no rollouts.jsonl beside the checkpoint")
	}
	out := evalOut(cmd, ck, sel)
	slog.Info("evaluating", "questions", len(qs), "routers", strings.Join(routers, ","), "out", out, "ranks", max(1, launch.WorldSize))
	progress := progressFunc()
	if launch.Rank > 0 {
		progress = nil // one progress display: rank 0's
	}
	table, err := eval.Run(ctx, s, qs, routers, out, slog.Default(), progress)
	if err != nil || launch.Rank > 0 {
		return err // rank 0 writes the tables
	}
	if err := table.Write(out); err != nil {
		return err
	}
	table.Text(os.Stdout)
	return nil
}

func progressFunc() func(string, int, int) {
	st, _ := os.Stderr.Stat()
	if st == nil || st.Mode()&os.ModeCharDevice == 0 {
		return func(r string, done, total int) {
			if done == total {
				slog.Info("router done", "router", r, "questions", total)
			}
		}
	}
	return func(r string, done, total int) {
		width := 30
		fill := width * done / max(total, 1)
		fmt.Fprintf(os.Stderr, "\r%-8s [%s%s] %d/%d", r, strings.Repeat("=", fill), strings.Repeat(" ", width-fill), done, total)
		if done == total {
			fmt.Fprintln(os.Stderr)
		}
	}
}

// setThreadsFrom sets libtorch's CPU threads: --threads, else configured
// (policy.threads, or decodingThreads for a command that only decodes).
func setThreadsFrom(cmd *cli.Command, configured int) error {
	threads := configured
	if cmd.Root().IsSet("threads") {
		threads = int(cmd.Root().Int("threads"))
	}
	return rollout.SetThreads(threads)
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// decodingThreads is the CPU thread count of recal serve, which only
// decodes (and not through Env.Roll, which switches to
// policy.decode_threads itself): policy.decode_threads when set, else
// policy.threads.
func decodingThreads(p config.Policy) int {
	if p.DecodeThreads > 0 {
		return p.DecodeThreads
	}
	return p.Threads
}
