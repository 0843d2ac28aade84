package main

import (
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/urfave/cli/v3"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/eval"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/torchbridge"
)

// What several commands share: reading list flags, libtorch's threads and
// the progress display.

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
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
	logBLAS()
	return rollout.SetThreads(threads)
}

// logBLAS logs the BLAS kernel the process runs, why it was chosen and the
// CPU (torchbridge.UseFastBLAS): one line at the start of every command
// that runs the policy on the CPU.
func logBLAS() {
	k := torchbridge.CurrentBLAS()
	slog.Info("blas", "kernel", k.String(), "cpu", k.CPU)
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

// withExtraModels adds the [[models]] of an --extra-models file to the pool.
func withExtraModels(cfg config.Config, path string) (config.Config, error) {
	if path == "" {
		return cfg, nil
	}
	extra, err := eval.LoadExtraModels(path)
	if err != nil {
		return cfg, usageError{err}
	}
	cfg.Pool.Models = append(slices.Clip(cfg.Pool.Models), extra...)
	if err := cfg.Pool.Validate(); err != nil {
		return cfg, usageError{fmt.Errorf("%s: %w", path, err)}
	}
	return cfg, nil
}

// splitFlag is --split of the commands that evaluate on test datasets;
// withVal (eval, frontier) also offers "val", the validation questions.
func splitFlag(withVal bool) cli.Flag {
	usage := "test split of data.test: id (those also in data.train: in domain), ood (the others) or all"
	if withVal {
		usage += "; or val, the validation questions held out of data.train's files (data.val_per_dataset of each, as training validates on): " +
			"choose settings there, not on the test questions"
	}
	return &cli.StringFlag{Name: "split", Value: "all", Usage: usage}
}

// splitVal is --split's name of the validation questions.
const splitVal = "val"

// datasetsFlag is --datasets, which replaces --split.
func datasetsFlag() cli.Flag {
	return &cli.StringFlag{Name: "datasets", Usage: "comma-separated test datasets (instead of --split)"}
}

// evalSelection names the test datasets of --split (of the config's
// data.test: data.Config.TestSplit) or --datasets, and the selection's
// name for the default --out. With withVal, --split val names the
// training datasets (data.train), whose validation questions
// evalQuestions then loads.
func evalSelection(cmd *cli.Command, cfg config.Config, withVal bool) ([]string, string, error) {
	sel := cmd.String("split")
	var names []string
	var err error
	switch {
	case cmd.IsSet("datasets"):
		sel = strings.ReplaceAll(cmd.String("datasets"), ",", "+")
		names, err = data.Expand(strings.Split(cmd.String("datasets"), ","))
	case withVal && sel == splitVal:
		names = cfg.Data.InDomain()
		if cfg.Data.ValPerDataset == 0 {
			err = fmt.Errorf("--split val: data.val_per_dataset is 0, so no question is held out for validation")
		}
	default:
		names, err = cfg.Data.TestSplit(sel)
	}
	if err != nil {
		return nil, "", usageError{err}
	}
	return names, sel, nil
}

// evalQuestions loads the test questions of --split or --datasets, or
// with --split val the validation questions (data.Config.LoadTrain's).
func evalQuestions(cmd *cli.Command, cfg config.Config) ([]data.Example, string, error) {
	names, sel, err := evalSelection(cmd, cfg, true)
	if err != nil {
		return nil, "", err
	}
	if sel == splitVal && !cmd.IsSet("datasets") {
		_, val, err := cfg.Data.LoadTrain()
		return val, sel, err
	}
	cfg.Data.Test = names
	qs, err := cfg.Data.LoadTest()
	return qs, sel, err
}
