package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/urfave/cli/v3"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/eval"
	"github.com/recal-project/recal/eval/embed"
	"github.com/recal-project/recal/internal/rollout"
)

const defaultRouters = "policy,direct,largest,random,prompt,knn"

func evalFlags() []cli.Flag {
	return []cli.Flag{
		splitFlag(true),
		datasetsFlag(),
		&cli.StringFlag{Name: "routers", Value: defaultRouters, Usage: "comma-separated routers: " + strings.Join(eval.RouterNames(), ", ")},
		&cli.StringFlag{Name: "extra-models", Usage: "TOML file of [[models]] added to the pool at evaluation only (unseen models)"},
		&cli.StringFlag{Name: "largest", Usage: "pool model of the largest router (default: highest output price)"},
		&cli.StringFlag{Name: "selector", Usage: "pool model the prompt router asks (default: the largest)"},
		&cli.StringFlag{Name: "knn-log", Usage: "rollouts.jsonl of a training run for the knn router (default: the checkpoint's run)"},
		&cli.IntFlag{Name: "knn-k", Value: 10, Usage: "neighbours of the knn router"},
		&cli.StringFlag{Name: "router-dir", Usage: "folder of the fitted baseline routers (mlp, routellm-mf, routerdc, graphrouter), one sub-folder each, made by recal fit"},
		&cli.StringFlag{Name: "sft-checkpoint", Usage: "checkpoint of the sft router, made by recal train-sft-direct"},
		&cli.StringFlag{Name: "outcomes", Usage: "outcome matrix (made by recal collect --out) the cascade router fits its stopping rule on"},
		&cli.Float64Flag{Name: "cascade-threshold", Value: 0.8, Usage: "the cascade router stops once its rule's score of the latest answer reaches this (0..1; 0: the cheapest model alone, 1: the whole chain)"},
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
			"never mixed in. Below the routers, the table's reference rows: the oracle (a question\n" +
			"is right when any pool model answers it right), the best and the cheapest single pool\n" +
			"model, from every pool model asked every question (results-model-<model>.jsonl, kept\n" +
			"and resumed alike); every row has its cost per question. --split's id and ood are the\n" +
			"datasets of data.test also in data.train and the others. --dry-run checks everything\n" +
			"first and writes nothing.",
		Flags: append(append(configFlags(),
			&cli.StringFlag{Name: "checkpoint", Usage: "policy checkpoint folder, or a training run folder: its checkpoints/best, else checkpoints/last (required for the policy and direct routers)"},
			&cli.StringFlag{Name: "out", Usage: "output folder (default <checkpoint>/../../eval-<split>, or runs/eval-<split>)"},
			&cli.BoolFlag{Name: "dry-run", Usage: "check the config, checkpoint, data, pool and API keys, print a summary and exit (0, or 2 listing every problem); loads and writes nothing"},
			nprocFlag(),
		), evalFlags()...),
		Action: runEval,
	}
}

// evalOut is --out, or its default (eval.DefaultOut).
func evalOut(cmd *cli.Command, checkpoint, sel string) string {
	if out := cmd.String("out"); out != "" {
		return out
	}
	return eval.DefaultOut(checkpoint, sel)
}

// knnLogOf is --knn-log, or the rollouts.jsonl of the checkpoint's run
// (eval.RunRollouts; "" if none).
func knnLogOf(cmd *cli.Command, checkpoint string) string {
	if p := cmd.String("knn-log"); p != "" {
		return p
	}
	return eval.RunRollouts(checkpoint)
}

// evalSetup opens the policy (on policy.device, in policy.dtype) and the
// pool (with the extra models), and sets up the evaluation with what cfg
// decides (eval.batch, the seed, the pool, [embedding] and its cache beside
// the pool's) and the flags' choices of routers.
func evalSetup(cmd *cli.Command, cfg config.Config, checkpoint string, qs []data.Example) (eval.Setup, func(), error) {
	cfg, err := withExtraModels(cfg, cmd.String("extra-models"))
	if err != nil {
		return eval.Setup{}, nil, err
	}
	// The pool's simulated models draw wrong answers from the golden answers
	// of the training, validation and test questions.
	train, val, err := cfg.Data.LoadTrain()
	if err != nil {
		return eval.Setup{}, nil, err
	}
	env, closeAll, err := rollout.Open(cfg.Rollout(), checkpoint, rollout.AnswerBank(train, val, qs), slog.Default())
	if err != nil {
		return eval.Setup{}, nil, err
	}
	s := eval.Setup{Env: env, Batch: cfg.Eval.Batch, Seed: cfg.Train.Seed, Pool: cfg.Pool, Embedding: cfg.Embedding,
		EmbeddingCache: embed.CacheDir(cfg.Pool.CacheDir), InDomain: cfg.Data.InDomain()}
	s.Largest, s.Selector, s.KNNLog, s.KNNK = cmd.String("largest"), cmd.String("selector"), knnLogOf(cmd, checkpoint), int(cmd.Int("knn-k"))
	s.SFTCheckpoint, s.CoTTemplate, s.RouterDir = cmd.String("sft-checkpoint"), cmd.String("cot-template"), cmd.String("router-dir")
	s.Outcomes, s.CascadeThreshold = cmd.String("outcomes"), cmd.Float64("cascade-threshold")
	return s, closeAll, nil
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
		names, sel, err := evalSelection(cmd, cfg, true)
		if err != nil {
			return err
		}
		cfg.Data.Test = names
		choices := evalChoices{routers: routers, routersSet: cmd.IsSet("routers"),
			extraModels: cmd.String("extra-models"), largest: cmd.String("largest"), selector: cmd.String("selector"),
			knnLog: knnLogOf(cmd, ck), out: evalOut(cmd, ck, sel), routerDir: cmd.String("router-dir"),
			sftCheckpoint: cmd.String("sft-checkpoint"), cotTemplate: cmd.String("cot-template")}
		return dryRunUntil(ctx, func() error { return dryRunEval(os.Stdout, cfg, cmd.String("config"), ck, choices) })
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
	group, err := joinEvalRanks(ctx, cmd, &cfg, launch)
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
	if err != nil {
		return err
	}
	// The reference rows: every pool model asked every question.
	if err = table.AddReferences(ctx, s, qs, out, slog.Default(), progress); err != nil || launch.Rank > 0 {
		return err // rank 0 writes the tables
	}
	if err := table.Write(out); err != nil {
		return err
	}
	table.Text(os.Stdout)
	return nil
}
