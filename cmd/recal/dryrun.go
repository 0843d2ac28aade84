package main

import (
	"io"
	"path/filepath"
	"slices"
	"strings"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/eval"
	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/llmpool"
	pf "github.com/recal-project/recal/preflight"
	"github.com/recal-project/recal/router"
)

// A dry run (--dry-run of train, eval and serve) resolves and checks
// everything a command would use, without loading weights into libtorch,
// calling a model or creating anything, and plans its memory per rank; the
// checks live in package preflight, this file only picks them for each
// command. It prints a summary and returns nil, or returns a usage error
// (exit status 2) listing every problem it found.

// preflight is a dry run under way, for the command files (serve.go) that
// use it through these methods.
type preflight struct {
	command string
	c       *pf.Check
}

func (p *preflight) check() *pf.Check {
	if p.c == nil {
		p.c = pf.New(p.command)
	}
	return p.c
}

func (p *preflight) problem(format string, args ...any) { p.check().Problem(format, args...) }
func (p *preflight) line(format string, args ...any)    { p.check().Line(format, args...) }
func (p *preflight) checkCreatable(key, dir string)     { p.check().Creatable(key, dir) }
func (p *preflight) checkPool(pc llmpool.Config, rc router.Config) {
	p.check().Pool(pc, rc)
}

// policySize is the checkpoint's shape as the dry run read it.
type policySize struct {
	cfg    *hfmodel.Config
	params int64
}

func (p *preflight) checkPolicy(key, dir string) (policySize, bool) {
	pol, ok := p.check().Policy(key, dir)
	return policySize{cfg: pol.Config, params: pol.Params}, ok
}

// finish prints the summary to w and returns nil, or every problem as a
// usage error.
func (p *preflight) finish(w io.Writer) error {
	if err := p.check().Finish(w); err != nil {
		return usageError{err}
	}
	return nil
}

// memory prints the job's memory plan per rank and its verdict.
func (p *preflight) memory(cfg config.Config, m *hfmodel.Config, job pf.Job) {
	if m != nil {
		p.check().Memory(cfg, m, job)
	}
}

// dryRunTrain is `recal train --dry-run`.
// world is the job's ranks (--nproc or the launcher's WORLD_SIZE).
func dryRunTrain(w io.Writer, cfg config.Config, configPath, runDir string, resume bool, world int) error {
	p := &preflight{command: "train"}
	p.line("config       %s", configPath)
	size, _ := p.checkPolicy("policy.checkpoint", cfg.Policy.Checkpoint)
	p.line("device       %s, %s", cfg.Policy.Device, cfg.Policy.DType)
	p.line("data         %s", cfg.Data.Dir)
	p.check().TrainData(cfg.Data, true)
	p.checkPool(cfg.Pool, cfg.Router)
	p.memory(cfg, size.cfg, pf.Job{Train: true, World: max(world, 1)})
	t := cfg.Train
	kl := "train.kl_coef"
	if t.Algorithm == "ppo" {
		kl = "ppo.kl_coef"
	}
	p.line("train        %d SFT steps, then %d %s steps of %d questions × %d responses, lr %g, %s %g",
		cfg.SFT.Steps, t.Steps, strings.ToUpper(t.Algorithm), t.BatchSize, t.GroupSize, t.LR, kl, cfg.KLCoef())
	p.line("lr schedule  %s", t.DescribeLR())
	holds := fileExists(filepath.Join(runDir, "metrics.jsonl")) || fileExists(filepath.Join(runDir, "checkpoints"))
	switch {
	case holds && !resume:
		p.problem("--run-dir: %s already holds a run; use --resume to continue it or choose another --run-dir", runDir)
	case holds:
		p.line("run folder   %s (resumed)", runDir)
	default:
		p.checkCreatable("--run-dir", runDir)
		p.line("run folder   %s (created by the run)", runDir)
	}
	return p.finish(w)
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
	p := &preflight{command: "eval"}
	p.line("config       %s", configPath)
	size, _ := p.checkPolicy("--checkpoint", checkpoint)
	p.line("device       %s, %s", cfg.Policy.Device, cfg.Policy.DType)
	p.line("data         %s", cfg.Data.Dir)
	p.check().TestData(cfg.Data)
	p.check().TrainData(cfg.Data, false) // the simulated models' answer bank reads them
	pc := cfg.Pool
	if s.extraModels != "" {
		extra, err := eval.LoadExtraModels(s.extraModels)
		if err != nil {
			p.problem("--extra-models: %v", err)
		} else {
			pc.Models = append(pc.Models, extra...)
			if err := pc.Validate(); err != nil {
				p.problem("--extra-models: %s: %v", s.extraModels, err)
			}
		}
	}
	p.checkPool(pc, cfg.Router)
	p.memory(cfg, size.cfg, pf.Job{World: 1, Rows: cfg.Eval.Batch, RowsKey: "eval.batch"})
	for _, f := range []struct{ flag, model string }{{"--largest", s.largest}, {"--selector", s.selector}} {
		if f.model != "" && !slices.ContainsFunc(pc.Models, func(m llmpool.ModelConfig) bool { return strings.EqualFold(m.Name, f.model) }) {
			p.problem("%s: %q is not a pool model", f.flag, f.model)
		}
	}
	if slices.Contains(s.routers, "knn") {
		switch {
		case s.knnLog != "" && !fileExists(s.knnLog):
			p.problem("--knn-log: %s does not exist", s.knnLog)
		case s.knnLog == "" && s.routersSet:
			p.problem("--routers: knn needs logged outcomes: --knn-log RUN_DIR/rollouts.jsonl (none beside the checkpoint)")
		case s.knnLog == "":
			s.routers = slices.DeleteFunc(slices.Clone(s.routers), func(r string) bool { return r == "knn" })
			p.line("             (knn skipped: no --knn-log and no rollouts.jsonl beside the checkpoint)")
		}
	}
	if slices.Contains(s.routers, "knn-decomp") && s.knnLog == "" {
		p.problem("--routers: knn-decomp needs logged outcomes: --knn-log RUN_DIR/rollouts.jsonl (none beside the checkpoint)")
	}
	if slices.Contains(s.routers, "sft") {
		if s.sftCheckpoint == "" {
			p.problem("--routers: sft needs --sft-checkpoint DIR, made by `%s`", eval.SFTDirectCommand)
		} else {
			p.checkPolicy("--sft-checkpoint", s.sftCheckpoint)
		}
	}
	if slices.Contains(s.routers, "cot") {
		tmpl := s.cotTemplate
		if tmpl == "" {
			tmpl = filepath.Join(filepath.Dir(cfg.Router.PromptTemplate), eval.CoTTemplateName)
		}
		if !fileExists(tmpl) {
			p.problem("--routers: cot: its prompt template %s does not exist (--cot-template)", tmpl)
		}
	}
	for _, r := range s.routers {
		if err := checkFitted(cfg, r, s.routerDir); err != nil {
			p.problem("--routers: %v", err)
		}
	}
	p.line("routers      %s", strings.Join(s.routers, ", "))
	p.line("references   oracle, best and cheapest single model: each of the %d pool models asked every question", len(pc.Models))
	p.checkCreatable("--out", s.out)
	p.line("out          %s", s.out)
	return p.finish(w)
}
