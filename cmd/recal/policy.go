package main

import (
	"context"
	"log/slog"

	"github.com/urfave/cli/v3"

	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/internal/policyinit"
	"github.com/recal-project/recal/internal/rollout"
)

func policyCommand() *cli.Command {
	return &cli.Command{
		Name:  "policy",
		Usage: "create policy checkpoints",
		Commands: []*cli.Command{{
			Name:  "init",
			Usage: "write a randomly initialised Qwen2-architecture checkpoint (Hugging Face format)",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "preset", Value: "tiny", Usage: "tiny (2 layers, hidden 128), small (4 layers, hidden 256), or the random-weight shapes qwen2.5-0.5b and qwen2.5-3b (for measuring memory and speed at scale)"},
				&cli.StringFlag{Name: "tokenizer", Usage: "tokenizer.json, or a folder holding it and tokenizer_config.json"},
				&cli.StringFlag{Name: "out", Usage: "output folder (replaced if it exists)"},
				&cli.Uint64Flag{Name: "seed", Value: 0, Usage: "initialisation seed"},
				&cli.FloatFlag{Name: "init-std", Value: 0.02, Usage: "standard deviation of the weights"},
				&cli.BoolFlag{Name: "copy-circuit", Usage: "write a copy (induction) circuit into the first two layers, so a policy trained from scratch can copy a reply's answer (see internal/hfmodel.CopyCircuit)"},
				&cli.StringSliceFlag{Name: "trim-corpus", Usage: "trim the tokenizer to the tokens of these files or folders (QA JSONL/Parquet: questions and answers; .tmpl, .txt: their text; .toml: its string values, not comments), for a small vocabulary (repeatable)"},
				&cli.IntFlag{Name: "trim-vocab", Usage: "with --trim-corpus: keep at most this many of the corpus's tokens, the most frequent, plus the single bytes and added tokens (0 = every corpus token)"},
			},
			Action: runPolicyInit,
		}},
	}
}

func runPolicyInit(ctx context.Context, cmd *cli.Command) error {
	if err := requireFlags(cmd, "tokenizer", "out"); err != nil {
		return err
	}
	if _, err := hfmodel.Preset(cmd.String("preset"), 151936); err != nil {
		return usageError{err}
	}
	if err := rollout.SetThreads(int(cmd.Root().Int("threads"))); err != nil {
		return err
	}
	return policyinit.Init(policyinit.Options{Preset: cmd.String("preset"), Tokenizer: cmd.String("tokenizer"), Out: cmd.String("out"),
		Seed: cmd.Uint64("seed"), InitStd: cmd.Float("init-std"), CopyCircuit: cmd.Bool("copy-circuit"),
		TrimCorpus: cmd.StringSlice("trim-corpus"), TrimVocab: int(cmd.Int("trim-vocab")), Log: slog.Default()})
}
