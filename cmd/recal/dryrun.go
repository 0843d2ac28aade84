package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"

	pf "github.com/recal-project/recal/cmd/recal/internal/preflight"
	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/eval"
	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/torchbridge"
)

// A dry run (--dry-run of train, eval and serve) resolves and checks
// everything a command would use, without loading weights into libtorch,
// calling a model or creating anything, and plans its memory per rank; the
// checks live in package preflight, this file only picks them for each
// command. It prints a summary and returns nil, or returns a usage error
// (exit status 2) listing every problem it found.

// dryRunMemory prints the job's memory plan per rank and its verdict,
// when the checkpoint's shape was read (m).
func dryRunMemory(c *pf.Check, cfg config.Config, m *hfmodel.Config, job pf.Job) {
	if m != nil {
		c.ReadDeviceWith(readDeviceMemory)
		c.Memory(cfg, m, job)
	}
}

// readDeviceMemory is a GPU's total memory, as CUDA reports it (an error in
// a build without CUDA or with no such device).
func readDeviceMemory(device string) (int64, error) {
	st, err := torchbridge.DeviceMemory(device, false)
	return st.Total, err
}

// dryRunUntil runs a dry run, returning at once when ctx ends (the first
// SIGINT or SIGTERM) with exit status 130: a dry run writes nothing, so
// nothing needs stopping cleanly, and the process may exit while a check
// still reads (the weights' non-finite check reads them all).
func dryRunUntil(ctx context.Context, run func() error) error {
	done := make(chan error, 1)
	go func() { done <- run() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return exitError{code: 130, err: fmt.Errorf("dry run stopped: %w", context.Cause(ctx))}
	}
}

// dryRunFinish prints the summary to w and returns nil, or every problem
// as a usage error.
func dryRunFinish(c *pf.Check, w io.Writer) error {
	if err := c.Finish(w); err != nil {
		return usageError{err}
	}
	return nil
}

// dryRunTrain is `recal train --dry-run`.
// world is the job's ranks (--nproc or the launcher's WORLD_SIZE).
func dryRunTrain(w io.Writer, cfg config.Config, configPath, runDir string, resume bool, world int) error {
	p := pf.New("train")
	p.Line("config       %s", configPath)
	pol, _ := p.Policy("policy.checkpoint", cfg.Policy.Checkpoint)
	p.Line("device       %s, %s", cfg.Policy.Device, cfg.Policy.DType)
	p.Line("blas         %s", torchbridge.CurrentBLAS())
	p.Line("data         %s", cfg.Data.Dir)
	p.TrainData(cfg.Data, true)
	p.Pool(cfg.Pool, cfg.Router)
	dryRunMemory(p, cfg, pol.Config, pf.Job{Train: true, World: max(world, 1)})
	t := cfg.Train
	kl := "train.kl_coef"
	if t.Algorithm == "ppo" {
		kl = "ppo.kl_coef"
	}
	p.Line("train        %d SFT steps, then %d %s steps of %d questions × %d responses, lr %g, %s %g",
		cfg.SFT.Steps, t.Steps, strings.ToUpper(t.Algorithm), t.BatchSize, t.GroupSize, t.LR, kl, cfg.KLCoef())
	p.Line("lr schedule  %s", t.DescribeLR())
	holds := fileExists(filepath.Join(runDir, "metrics.jsonl")) || fileExists(filepath.Join(runDir, "checkpoints"))
	switch {
	case holds && !resume:
		p.Problem("--run-dir: %s already holds a run; use --resume to continue it or choose another --run-dir", runDir)
	case holds:
		p.Line("run folder   %s (resumed)", runDir)
	default:
		p.Creatable("--run-dir", runDir)
		p.Line("run folder   %s (created by the run)", runDir)
	}
	return dryRunFinish(p, w)
}

// evalChoices are the flags of recal eval that the dry run checks.
type evalChoices struct {
	routers                                []string
	routersSet                             bool // --routers was given (else knn is dropped when it has no log)
	extraModels, largest, selector, knnLog string
	out                                    string
	routerDir                              string // --router-dir of the fitted baseline routers
	sftCheckpoint, cotTemplate             string // --sft-checkpoint and --cot-template
}

// dryRunEval is `recal eval --dry-run`: what evalSetup and eval.Run would use.
func dryRunEval(w io.Writer, cfg config.Config, configPath, checkpoint string, s evalChoices) error {
	p := pf.New("eval")
	p.Line("config       %s", configPath)
	pol, _ := p.Policy("--checkpoint", checkpoint)
	p.Line("device       %s, %s", cfg.Policy.Device, cfg.Policy.DType)
	p.Line("blas         %s", torchbridge.CurrentBLAS())
	p.Line("data         %s", cfg.Data.Dir)
	p.TestData(cfg.Data)
	p.TrainData(cfg.Data, false) // the simulated models' answer bank reads them
	pc := cfg.Pool
	if s.extraModels != "" {
		extra, err := eval.LoadExtraModels(s.extraModels)
		if err != nil {
			p.Problem("--extra-models: %v", err)
		} else {
			pc.Models = append(pc.Models, extra...)
			if err := pc.Validate(); err != nil {
				p.Problem("--extra-models: %s: %v", s.extraModels, err)
			}
		}
	}
	p.Pool(pc, cfg.Router)
	dryRunMemory(p, cfg, pol.Config, pf.Job{World: 1, Rows: cfg.Eval.Batch, RowsKey: "eval.batch"})
	for _, f := range []struct{ flag, model string }{{"--largest", s.largest}, {"--selector", s.selector}} {
		if f.model != "" && !slices.ContainsFunc(pc.Models, func(m llmpool.ModelConfig) bool { return strings.EqualFold(m.Name, f.model) }) {
			p.Problem("%s: %q is not a pool model", f.flag, f.model)
		}
	}
	if slices.Contains(s.routers, "knn") {
		switch {
		case s.knnLog != "" && !fileExists(s.knnLog):
			p.Problem("--knn-log: %s does not exist", s.knnLog)
		case s.knnLog == "" && s.routersSet:
			p.Problem("--routers: knn needs logged outcomes: --knn-log RUN_DIR/rollouts.jsonl (none beside the checkpoint)")
		case s.knnLog == "":
			s.routers = slices.DeleteFunc(slices.Clone(s.routers), func(r string) bool { return r == "knn" })
			p.Line("             (knn skipped: no --knn-log and no rollouts.jsonl beside the checkpoint)")
		}
	}
	if slices.Contains(s.routers, "knn-decomp") && s.knnLog == "" {
		p.Problem("--routers: knn-decomp needs logged outcomes: --knn-log RUN_DIR/rollouts.jsonl (none beside the checkpoint)")
	}
	if slices.Contains(s.routers, "sft") {
		if s.sftCheckpoint == "" {
			p.Problem("--routers: sft needs --sft-checkpoint DIR, made by `%s`", eval.SFTDirectCommand)
		} else {
			p.Policy("--sft-checkpoint", s.sftCheckpoint)
		}
	}
	if slices.Contains(s.routers, "cot") {
		tmpl := s.cotTemplate
		if tmpl == "" {
			tmpl = filepath.Join(filepath.Dir(cfg.Router.PromptTemplate), eval.CoTTemplateName)
		}
		if !fileExists(tmpl) {
			p.Problem("--routers: cot: its prompt template %s does not exist (--cot-template)", tmpl)
		}
	}
	for _, r := range s.routers {
		if err := checkFitted(cfg, r, s.routerDir); err != nil {
			p.Problem("--routers: %v", err)
		}
	}
	p.Line("routers      %s", strings.Join(s.routers, ", "))
	p.Line("references   oracle, best and cheapest single model: each of the %d pool models asked every question", len(pc.Models))
	p.Creatable("--out", s.out)
	p.Line("out          %s", s.out)
	return dryRunFinish(p, w)
}
