package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/urfave/cli/v3"

	"github.com/recal-project/recal/internal/generate"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/internal/tokenizer"
	"github.com/recal-project/recal/torchbridge"
)

func generateCommand() *cli.Command {
	return &cli.Command{
		Name:      "generate",
		Usage:     "continue a prompt with a policy checkpoint; prints only the continuation to stdout",
		ArgsUsage: " ",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "checkpoint", Usage: "Hugging Face checkpoint folder (config.json, model.safetensors, tokenizer.json)"},
			&cli.StringFlag{Name: "prompt", Usage: "prompt text"},
			&cli.IntFlag{Name: "max-new-tokens", Value: 128, Usage: "most tokens to generate"},
			&cli.FloatFlag{Name: "temperature", Value: 0, Usage: "sampling temperature; 0 is greedy"},
			&cli.FloatFlag{Name: "top-p", Value: 1, Usage: "nucleus sampling mass (1 = off)"},
			&cli.IntFlag{Name: "top-k", Value: 0, Usage: "sample among the k most likely tokens (0 = off)"},
			&cli.Uint64Flag{Name: "seed", Value: 0, Usage: "sampling seed"},
			&cli.BoolFlag{Name: "chat", Usage: "wrap the prompt in the chat template as a user message"},
			&cli.StringSliceFlag{Name: "stop", Usage: "stop after this string (repeatable)"},
			&cli.StringFlag{Name: "device", Value: "cpu", Usage: "cpu, cuda or cuda:N"},
			&cli.StringFlag{Name: "dtype", Value: "float32", Usage: "float32 or bfloat16"},
		},
		Action: runGenerate,
	}
}

func runGenerate(ctx context.Context, cmd *cli.Command) error {
	if err := requireFlags(cmd, "checkpoint", "prompt"); err != nil {
		return err
	}
	maxNew := int(cmd.Int("max-new-tokens"))
	if maxNew < 1 {
		return usageError{fmt.Errorf("--max-new-tokens must be at least 1")}
	}
	if t := cmd.Float("temperature"); t < 0 {
		return usageError{fmt.Errorf("--temperature must be ≥ 0")}
	}
	if p := cmd.Float("top-p"); p <= 0 || p > 1 {
		return usageError{fmt.Errorf("--top-p must be in (0, 1]")}
	}
	if err := rollout.SetThreads(int(cmd.Root().Int("threads"))); err != nil {
		return err
	}
	e, err := rollout.OpenEngine(cmd.String("checkpoint"), torchbridge.Options{Device: cmd.String("device"), DType: cmd.String("dtype")})
	if err != nil {
		return err
	}
	defer e.Close()
	prompt := cmd.String("prompt")
	if cmd.Bool("chat") {
		prompt = e.Tok.FormatChat([]tokenizer.Message{{Role: "user", Content: prompt}}, true)
	}
	ids := rollout.ToInt32(e.Tok.Encode(prompt))
	if len(ids) == 0 {
		return usageError{fmt.Errorf("--prompt is empty")}
	}
	if len(ids) >= e.CtxLen {
		return fmt.Errorf("the prompt has %d tokens, more than the checkpoint's context of %d (max_position_embeddings) leaves room for", len(ids), e.CtxLen)
	}
	if len(ids)+maxNew > e.CtxLen {
		maxNew = e.CtxLen - len(ids)
		slog.Warn("max-new-tokens cut to fit the context", "max_new_tokens", maxNew, "context", e.CtxLen)
	}
	cache, err := e.Policy.NewCache(1, len(ids)+maxNew)
	if err != nil {
		return err
	}
	defer cache.Close()
	req := generate.Request{Row: 0, Prompt: ids, MaxNewTokens: maxNew, Stop: cmd.StringSlice("stop"), EOS: e.EOS}
	s := generate.Sampling{Temperature: cmd.Float("temperature"), TopP: cmd.Float("top-p"), TopK: int(cmd.Int("top-k"))}
	out, err := generate.Run(ctx, rollout.Decoder{C: cache}, e.Tok, []generate.Request{req}, s, cmd.Uint64("seed"))
	if err != nil {
		return err
	}
	slog.Info("generated", "prompt_tokens", len(ids), "new_tokens", len(out[0].Tokens), "stop", out[0].Reason)
	_, err = os.Stdout.Write(out[0].Text)
	if err == nil {
		_, err = fmt.Fprintln(os.Stdout)
	}
	return err
}
