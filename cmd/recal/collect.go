package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/recal-project/recal/eval"
	"github.com/recal-project/recal/eval/baselines"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/llmpool"
)

func collectCommand() *cli.Command {
	return &cli.Command{
		Name:  "collect",
		Usage: "ask every pool model every training question directly and record the outcomes the baseline routers learn from",
		Description: "Asks each model of [pool] each sampled training question of [data] (the training split,\n" +
			"validation questions held out) through the pool, its cache and its limits, and appends per\n" +
			"(question, model) the reply, its answer's F1 and EM, tokens, cost, latency and failure to\n" +
			"--out/outcomes.jsonl; --out/pool.json names the pool. Rerunning resumes: pairs with a reply\n" +
			"are skipped, failed calls are asked again; a folder of another pool is refused. Then:\n" +
			"recal fit --outcomes DIR --router-dir ROUTERS.",
		Flags: append(configFlags(),
			&cli.StringFlag{Name: "out", Usage: "outcome folder (created; resumed when it holds this pool's outcomes)"},
			&cli.IntFlag{Name: "per-dataset", Usage: "training questions per dataset, sampled with data.seed (default data.train_per_dataset; 0 = all)"},
			&cli.IntFlag{Name: "chunk", Value: 256, Usage: "calls made together and appended in one write"},
		),
		Action: runCollect,
	}
}

func runCollect(ctx context.Context, cmd *cli.Command) error {
	if err := requireFlags(cmd, "out"); err != nil {
		return err
	}
	cfg, err := loadConfig(cmd)
	if err != nil {
		return err
	}
	if cmd.IsSet("per-dataset") {
		if n := cmd.Int("per-dataset"); n < 0 {
			return usageError{fmt.Errorf("collect: --per-dataset %d: want ≥ 0", n)}
		}
		cfg.Data.TrainPerDataset = int(cmd.Int("per-dataset"))
	}
	if cmd.Int("chunk") < 1 {
		return usageError{fmt.Errorf("collect: --chunk %d: want ≥ 1", cmd.Int("chunk"))}
	}
	train, _, err := cfg.Data.LoadTrain()
	if err != nil {
		return err
	}
	// Simulated models draw wrong answers from a bank of golden answers; it
	// holds every training file's, whatever --per-dataset samples, so that
	// sampling more later keeps the outcomes already collected valid.
	all := cfg.Data
	all.TrainPerDataset = 0
	full, val, err := all.LoadTrain()
	if err != nil {
		return err
	}
	bank := rollout.AnswerBank(full, val)
	pool, err := llmpool.New(cfg.Pool, llmpool.WithLogger(slog.Default()), llmpool.WithAnswerBank(bank))
	if err != nil {
		return err
	}
	defer pool.Close()
	info, err := baselines.PoolIdentity(cfg.Pool, bank)
	if err != nil {
		return err
	}
	out := cmd.String("out")
	slog.Info("collecting", "questions", len(train), "models", len(info.Models), "out", out)
	start := time.Now()
	st, err := baselines.Collect(ctx, out, baselines.CollectOptions{Pool: pool, Info: info, Questions: train,
		Extract: eval.ExtractAnswer, Chunk: int(cmd.Int("chunk")), Log: slog.Default(), Progress: collectProgress()})
	if err != nil {
		return err
	}
	m, err := baselines.LoadMatrix(out)
	if err != nil {
		return err
	}
	slog.Info("collected", "asked", st.Asked, "skipped", st.Skipped, "failed", st.Failed,
		"took", time.Since(start).Round(time.Millisecond).String(), "matrix", m.Digest)
	fmt.Printf("%s: %d questions × %d models (%d incomplete), matrix %s\n%s", out, len(m.Questions), len(m.Models),
		m.Incomplete, m.Digest, m.Summary())
	return nil
}

func collectProgress() func(int, int) {
	st, _ := os.Stderr.Stat()
	tty := st != nil && st.Mode()&os.ModeCharDevice != 0
	return func(done, total int) {
		if tty {
			fmt.Fprintf(os.Stderr, "\rcollect %d/%d", done, total)
			if done == total {
				fmt.Fprintln(os.Stderr)
			}
		}
	}
}
