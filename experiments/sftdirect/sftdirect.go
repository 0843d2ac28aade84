// Package sftdirect is the SFT row of the ReCal paper's Table 1, a baseline
// with no routing: the starting policy fine-tuned to answer the training
// questions itself. It trains a policy (with trainer's supervised fitting)
// and so needs cgo and libtorch, unlike the rest of baselines, which stays
// pure Go; eval runs the checkpoint it writes.
package sftdirect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/atomicfile"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/internal/tokenizer"
	"github.com/recal-project/recal/router"
	"github.com/recal-project/recal/torchbridge"
	"github.com/recal-project/recal/trainer"
)

// SFT-direct is the "SFT" row of the ReCal paper's Table 1 (no routing):
// the starting checkpoint (policy.checkpoint) fine-tuned to answer the
// training questions itself, with no pool. Each demonstration is the direct
// prompt (rollout.DirectProtocol) followed by
//
//	<think>I will answer from what I know.</think>
//	<answer> GOLDEN</answer>
//
// GOLDEN being the question's first golden answer. The paper does not say
// what its SFT baseline's targets hold beyond the answer; the fixed think
// line is recal's, so the demonstration has the protocol's shape. The
// fitting is the warm-up's (trainer.FitDemos: sft.batch_size, sft.lr decaying
// linearly, sft.answer_weight on the answer's tokens, AdamW with the
// [train] moments), for --steps steps (default sft.steps).

// directThink is the reasoning of a direct-answer demonstration.
const directThink = "I will answer from what I know."

// Manifest is the file in an SFT-direct folder that says what it
// was trained from; a folder is reused only for the same inputs.
const Manifest = "sft-direct.json"

// Demos writes, for each question with a golden answer, the direct
// prompt and the answer turn above. The mask is 1 on the think part and
// answerWeight on the answer (0 on the prompt). No pool is called.
func Demos(eng *rollout.Engine, rc router.Config, qs []data.Example, answerWeight float32) ([]trainer.Demo, error) {
	env, err := rollout.DirectEnv(eng, nil, rc)
	if err != nil {
		return nil, err
	}
	var out []trainer.Demo
	for _, q := range qs {
		golden := ""
		for _, g := range q.Golden {
			if g = strings.TrimSpace(g); g != "" {
				golden = g
				break
			}
		}
		if golden == "" {
			continue
		}
		p, err := env.PromptTokens(q)
		if err != nil {
			return nil, err
		}
		think := rollout.ToInt32(eng.Tok.EncodeSegments(tokenizer.Segment{Text: router.ThinkOpen + directThink + router.ThinkClose + "\n"}))
		// A space before the answer, as in the warm-up's demonstrations;
		// the answer is plain text.
		answer := rollout.ToInt32(eng.Tok.EncodeSegments(tokenizer.Segment{Text: router.AnswerOpen + " "}, tokenizer.Segment{Text: golden, Plain: true},
			tokenizer.Segment{Text: router.AnswerClose}))
		d := trainer.Demo{Correct: true}
		d.Tokens = append(append(append(d.Tokens, p...), think...), answer...)
		d.Mask = make([]float32, len(d.Tokens))
		for k := len(p); k < len(d.Tokens); k++ {
			d.Mask[k] = 1
			if k >= len(p)+len(think) {
				d.Mask[k] = answerWeight
			}
		}
		out = append(out, d)
	}
	return out, nil
}

// Options say what Train starts from and writes.
type Options struct {
	// Out is the Hugging Face folder written (replaced atomically).
	Out string
	// Steps of fitting; 0 means sft.steps.
	Steps int
	// BaseID identifies the weights of policy.checkpoint (the caller's
	// digest, e.g. eval.CheckpointDigest); it is recorded in the manifest,
	// so that new starting weights at the same path are not mistaken for
	// the old.
	BaseID string
	Log    *slog.Logger
}

// Spec is what decides an SFT-direct checkpoint: the manifest's
// contents.
type Spec struct {
	Version int    `json:"version"`
	Base    string `json:"base"`    // policy.checkpoint as given
	BaseID  string `json:"base_id"` // its weights' digest (Options.BaseID)
	DType   string `json:"dtype"`
	// Data: the training split the demonstrations come from.
	Data data.Config `json:"data"`
	// Steps, and the [sft] and [train] keys the fitting reads.
	Steps        int     `json:"steps"`
	BatchSize    int     `json:"batch_size"`
	LR           float64 `json:"lr"`
	AnswerWeight float64 `json:"answer_weight"`
	Seed         int64   `json:"seed"`
	Beta1        float64 `json:"beta1"`
	Beta2        float64 `json:"beta2"`
	AdamEps      float64 `json:"adam_eps"`
	WeightDecay  float64 `json:"weight_decay"`
	MaxGradNorm  float64 `json:"max_grad_norm"`
	MicroBatch   int     `json:"micro_batch"`
	// Prompt is the text of the prompt template (the demonstrations' prompt).
	Prompt string `json:"prompt"`
}

// version changes when the demonstrations change.
const version = 1

// SpecOf is the spec Train would train under cfg and opt.
func SpecOf(cfg config.Config, opt Options) (Spec, error) {
	tmpl, err := os.ReadFile(cfg.Router.PromptTemplate)
	if err != nil {
		return Spec{}, fmt.Errorf("sftdirect: prompt template: %w", err)
	}
	steps := opt.Steps
	if steps <= 0 {
		steps = cfg.SFT.Steps
	}
	d := cfg.Data
	d.Test, d.TestPerDataset = nil, 0 // the test split does not decide the fit
	tc := cfg.Train
	return Spec{Version: version, Base: cfg.Policy.Checkpoint, BaseID: opt.BaseID, DType: cfg.Policy.DType,
		Data: d, Steps: steps, BatchSize: cfg.SFT.BatchSize, LR: cfg.SFT.LR, AnswerWeight: cfg.SFT.AnswerWeight, Seed: tc.Seed,
		Beta1: tc.Beta1, Beta2: tc.Beta2, AdamEps: tc.AdamEps, WeightDecay: tc.WeightDecay, MaxGradNorm: tc.MaxGradNorm,
		MicroBatch: tc.MicroBatch, Prompt: string(tmpl)}, nil
}

// ErrOther is returned by Ready for a folder trained
// from other inputs.
var ErrOther = errors.New("sftdirect: the folder was trained from other inputs")

// Ready reports whether dir holds an SFT-direct checkpoint of
// spec: false when it does not exist, ErrOther (naming the fields
// that differ) when it was trained from other inputs.
func Ready(dir string, spec Spec) (bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, Manifest))
	if errors.Is(err, os.ErrNotExist) {
		if _, err := os.Stat(dir); err == nil {
			return false, fmt.Errorf("%w: %s exists without %s; remove it or choose another folder", ErrOther, dir, Manifest)
		}
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("sftdirect: %w", err)
	}
	var was Spec
	if err := json.Unmarshal(b, &was); err != nil {
		return false, fmt.Errorf("sftdirect: %s: %w", filepath.Join(dir, Manifest), err)
	}
	var diff []string
	a, w := reflect.ValueOf(spec), reflect.ValueOf(was)
	for i := range a.NumField() {
		if !reflect.DeepEqual(a.Field(i).Interface(), w.Field(i).Interface()) {
			name, _, _ := strings.Cut(a.Type().Field(i).Tag.Get("json"), ",")
			diff = append(diff, name)
		}
	}
	if len(diff) > 0 {
		slices.Sort(diff)
		return false, fmt.Errorf("%w: %s differs in %s; remove it or choose another folder", ErrOther, dir, strings.Join(diff, ", "))
	}
	return true, nil
}

// Train fine-tunes policy.checkpoint on direct-answer
// demonstrations of the training split (see above) and saves it to
// opt.Out as a Hugging Face folder with its manifest and one line per
// step in sft.jsonl. No pool is built or called.
func Train(ctx context.Context, cfg config.Config, opt Options) error {
	log := opt.Log
	if log == nil {
		log = slog.Default()
	}
	spec, err := SpecOf(cfg, opt)
	if err != nil {
		return err
	}
	if opt.Out == "" {
		return errors.New("sftdirect: no output folder")
	}
	train, _, err := cfg.Data.LoadTrain()
	if err != nil {
		return err
	}
	eng, err := rollout.OpenEngine(cfg.Policy.Checkpoint, torchbridge.Options{Device: cfg.Policy.Device, DType: cfg.Policy.DType, EagerDecode: cfg.Policy.EagerDecode})
	if err != nil {
		return err
	}
	defer eng.Close()
	var lines []trainer.SFTLine
	fit := cfg
	fit.SFT.Steps = spec.Steps
	build := func(_ int, qs []data.Example) ([]trainer.Demo, error) {
		return Demos(eng, cfg.Router, qs, float32(cfg.SFT.AnswerWeight))
	}
	record := func(l trainer.SFTLine) error { lines = append(lines, l); return nil }
	if err := trainer.FitDemos(ctx, fit.Training(), eng.Policy, train, "sft-direct", build, record, log); err != nil {
		return err
	}
	// The folder is written whole under a hidden name, then renamed over
	// opt.Out: a kill leaves the old folder or the new one.
	out := filepath.Clean(opt.Out)
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return fmt.Errorf("sftdirect: %w", err)
	}
	staging := filepath.Join(filepath.Dir(out), "."+filepath.Base(out)+".new")
	if err := os.RemoveAll(staging); err != nil {
		return fmt.Errorf("sftdirect: %w", err)
	}
	if err := eng.Policy.Save(staging); err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(staging, "sft.jsonl"), func(w io.Writer) error {
		e := json.NewEncoder(w)
		for _, l := range lines {
			if err := e.Encode(l); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(staging, Manifest), func(w io.Writer) error {
		e := json.NewEncoder(w)
		e.SetIndent("", "  ")
		return e.Encode(spec)
	}); err != nil {
		return err
	}
	if err := syncDir(staging); err != nil {
		return fmt.Errorf("sftdirect: %w", err)
	}
	if err := os.RemoveAll(out); err != nil {
		return fmt.Errorf("sftdirect: %w", err)
	}
	if err := os.Rename(staging, out); err != nil {
		return fmt.Errorf("sftdirect: %w", err)
	}
	log.Info("sft-direct saved", "out", out, "steps", spec.Steps)
	return nil
}

// syncDir makes a folder's entries durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
