package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/recal-project/recal/experiments/table1"
	"github.com/recal-project/recal/torchbridge"
)

// recal table1: package table1 makes the table (its doc lists the work
// folder); this file parses the flags.

func table1Command() *cli.Command {
	return &cli.Command{
		Name:  "table1",
		Usage: "make the ReCal paper's Table 1: train what is missing, evaluate every row, write the table",
		Description: "Rows, grouped as in the paper: no routing (Vanilla = policy.checkpoint answering alone,\n" +
			"CoT, SFT, and RAG and Search-R1, which are not run: they need a Wikipedia corpus and a\n" +
			"retriever), heuristic and discriminative routers (Largest, Prompt, Prompt*, KNN, KNN*, MLP,\n" +
			"RouteLLM-MF, RouterDC, GraphRouter) and RL routers (Router-R1, ReCal = --checkpoint).\n" +
			"Missing parts are made in --work: the outcome matrix (collect), the four fitted routers\n" +
			"(fit), the SFT-direct checkpoint (--sft-steps) and the Router-R1 policy (PPO, as many steps\n" +
			"as --checkpoint's run trained unless --r1-steps, from that run's warm-up checkpoint when\n" +
			"it has one, so that Router-R1 and ReCal differ in the RL algorithm). Both RL rows evaluate\n" +
			"their run's checkpoints/best, else checkpoints/last. Rerunning reuses all of it and every\n" +
			"answer. Below the paper's rows, the reference rows (not routers): the oracle, the best and\n" +
			"the cheapest single pool model, every pool model asked every question (into\n" +
			"--work/eval-<split>/reference); every row has its cost per question.\n" +
			"Writes --work/eval-<split>/table.{json,csv,md} and prints the table.",
		Flags: append(configFlags(),
			&cli.StringFlag{Name: "work", Value: "runs/table1", Usage: "work folder: outcome matrix, fitted routers, checkpoints, results, table"},
			&cli.StringFlag{Name: "checkpoint", Value: "runs/recal", Usage: "the ReCal policy: a training run folder (its checkpoints/best, else last; make train's by default) or a checkpoint folder RUN/checkpoints/X"},
			splitFlag(false),
			datasetsFlag(),
			&cli.IntFlag{Name: "sft-steps", Usage: "steps of the SFT-direct fit (default sft.steps)"},
			&cli.IntFlag{Name: "r1-steps", Usage: "PPO steps of the Router-R1 policy (default: train.steps of --checkpoint's run, from its config.toml: ReCal's step budget)"},
			&cli.StringFlag{Name: "r1-start", Usage: "checkpoint Router-R1 starts from, with no warm-up (default: checkpoints/sft of --checkpoint's run, else policy.checkpoint with the [sft] warm-up)"},
			&cli.StringFlag{Name: "largest", Usage: "pool model of the largest router (default: highest output price)"},
			&cli.StringFlag{Name: "selector", Usage: "pool model the prompt routers ask (default: the largest)"},
			&cli.StringFlag{Name: "knn-log", Usage: "rollouts.jsonl for the knn routers (default: --checkpoint's run)"},
			&cli.IntFlag{Name: "knn-k", Value: 10, Usage: "neighbours of the knn routers"},
		),
		Action: func(ctx context.Context, cmd *cli.Command) error {
			torchbridge.UseTrainingMalloc() // it trains; glibc reads these at start-up
			cfg, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			names, sel, err := evalSelection(cmd, cfg, false)
			if err != nil {
				return err
			}
			if err := setThreadsFrom(cmd, cfg.Policy.Threads); err != nil {
				return err
			}
			o := table1.Options{Work: cmd.String("work"), Checkpoint: cmd.String("checkpoint"), Datasets: names, Split: sel,
				SFTSteps: int(cmd.Int("sft-steps")), R1Steps: int(cmd.Int("r1-steps")), R1Start: cmd.String("r1-start"),
				Largest: cmd.String("largest"), Selector: cmd.String("selector"), KNNLog: cmd.String("knn-log"),
				KNNK: int(cmd.Int("knn-k")), Log: slog.Default(), Progress: progressFunc()}
			if cmd.IsSet("r1-steps") && o.R1Steps < 1 || o.SFTSteps < 0 {
				return usageError{fmt.Errorf("table1: --r1-steps %d and --sft-steps %d: want ≥ 1 and ≥ 0", o.R1Steps, o.SFTSteps)}
			}
			if o.SFTSteps == 0 && cfg.SFT.Steps == 0 {
				return usageError{fmt.Errorf("train-sft-direct: sft.steps is 0 and no --steps given: nothing to fit")}
			}
			start := time.Now()
			t, rep, err := table1.Run(ctx, cfg, o)
			if err != nil {
				return err
			}
			t.Text(os.Stdout)
			fmt.Printf("\n%s\ntook %s; written to %s\n", rep, time.Since(start).Round(time.Second), filepath.Join(o.Work, "eval-"+o.Split))
			return nil
		},
	}
}
