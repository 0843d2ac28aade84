package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/urfave/cli/v3"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/eval"
	"github.com/recal-project/recal/experiments/sftdirect"
	"github.com/recal-project/recal/torchbridge"
)

func sftDirectCommand() *cli.Command {
	return &cli.Command{
		Name:  "train-sft-direct",
		Usage: "fine-tune policy.checkpoint to answer training questions directly, with no pool (Table 1's SFT row)",
		Description: "Supervised fine-tuning of [policy] checkpoint on demonstrations of the training split:\n" +
			"the direct prompt (router.prompt_template listing no models, no call allowed) followed by\n" +
			"<think>I will answer from what I know.</think> <answer> GOLDEN</answer>. The fitting is the\n" +
			"warm-up's ([sft] batch_size, lr decaying linearly, answer_weight; AdamW with [train]'s\n" +
			"moments) for --steps steps. Writes a Hugging Face folder to --out with sft-direct.json\n" +
			"(what it was trained from) and sft.jsonl; no pool is built. Evaluate it with\n" +
			"recal eval --routers sft --sft-checkpoint DIR.",
		Flags: append(configFlags(),
			&cli.StringFlag{Name: "out", Usage: "output folder (replaced whole)"},
			&cli.IntFlag{Name: "steps", Usage: "fitting steps (default sft.steps)"},
		),
		Action: func(ctx context.Context, cmd *cli.Command) error {
			torchbridge.UseTrainingMalloc() // glibc reads these at start-up
			if err := requireFlags(cmd, "out"); err != nil {
				return err
			}
			cfg, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			if err := setThreadsFrom(cmd, cfg.Policy.Threads); err != nil {
				return err
			}
			opt, err := sftDirectOptions(cfg, cmd.String("out"), int(cmd.Int("steps")))
			if err != nil {
				return err
			}
			return sftdirect.Train(ctx, cfg, opt)
		},
	}
}

// sftDirectOptions are the options of an SFT-direct run of cfg into out.
func sftDirectOptions(cfg config.Config, out string, steps int) (sftdirect.Options, error) {
	if steps < 0 {
		return sftdirect.Options{}, usageError{fmt.Errorf("train-sft-direct: --steps %d: want ≥ 0", steps)}
	}
	if steps == 0 && cfg.SFT.Steps == 0 {
		return sftdirect.Options{}, usageError{fmt.Errorf("train-sft-direct: sft.steps is 0 and no --steps given: nothing to fit")}
	}
	base, err := eval.CheckpointDigest(cfg.Policy.Checkpoint)
	if err != nil {
		return sftdirect.Options{}, fmt.Errorf("train-sft-direct: policy.checkpoint: %w", err)
	}
	return sftdirect.Options{Out: out, Steps: steps, BaseID: base, Log: slog.Default()}, nil
}
