package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/eval"
	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/router"
	"github.com/recal-project/recal/tokenizer"
)

// A dry run (--dry-run of train and eval; serve can use the same) resolves
// and checks everything a command would use, without loading weights into
// libtorch, calling a model or creating anything: the policy checkpoint's
// config.json, tokenizer and safetensors headers, the data files (loaded and
// counted), the prompt template, the pool's API-key variables and cache
// folder, and the folders the command would create. It prints a summary
// and returns nil, or returns a usage error (exit status 2) listing every
// problem it found.

// preflight collects what a dry run found.
type preflight struct {
	command  string   // "train", "eval", …, for the error
	problems []string // each a line naming what is wrong
	summary  strings.Builder
}

func (p *preflight) problem(format string, args ...any) {
	p.problems = append(p.problems, fmt.Sprintf(format, args...))
}

func (p *preflight) line(format string, args ...any) {
	fmt.Fprintf(&p.summary, format+"\n", args...)
}

// finish prints the summary to w and returns nil, or returns every problem.
func (p *preflight) finish(w io.Writer) error {
	if len(p.problems) > 0 {
		noun := "problems"
		if len(p.problems) == 1 {
			noun = "problem"
		}
		return usageError{fmt.Errorf("%s --dry-run: %d %s:\n  %s", p.command, len(p.problems), noun, strings.Join(p.problems, "\n  "))}
	}
	fmt.Fprint(w, p.summary.String())
	fmt.Fprintf(w, "%s --dry-run: no problem found; nothing was loaded into libtorch or written\n", p.command)
	return nil
}

// policySize is the shape of a checkpoint as the dry run reads it.
type policySize struct {
	cfg    *hfmodel.Config
	params int64
}

// checkPolicy checks a checkpoint folder without loading it into libtorch:
// config.json, the tokenizer (and that its ids fit the vocabulary), the
// end-of-sequence ids, and every tensor the policy needs in the safetensors
// headers (name, shape and dtype). key names the setting or flag that named dir.
func (p *preflight) checkPolicy(key, dir string) (policySize, bool) {
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		p.problem("%s: %s does not exist (a Hugging Face checkpoint folder: config.json, model.safetensors, tokenizer.json)", key, dir)
		return policySize{}, false
	case err != nil:
		p.problem("%s: %v", key, err)
		return policySize{}, false
	case !st.IsDir():
		p.problem("%s: %s is not a folder", key, dir)
		return policySize{}, false
	}
	ok := true
	tok, err := tokenizer.Load(dir)
	if err != nil {
		p.problem("%s: %v", key, err)
		ok = false
	}
	cfg, err := hfmodel.LoadConfig(dir)
	if err != nil {
		p.problem("%s: %v", key, err)
		return policySize{}, false
	}
	if tok != nil && int64(tok.VocabSize()) > cfg.VocabSize {
		p.problem("%s: the tokenizer has %d ids but config.json's vocab_size is %d", key, tok.VocabSize(), cfg.VocabSize)
		ok = false
	}
	if _, err := hfmodel.EOS(dir, cfg); err != nil {
		p.problem("%s: %v", key, err)
		ok = false
	}
	size := policySize{cfg: cfg}
	w, err := hfmodel.OpenWeights(dir)
	if err != nil {
		p.problem("%s: %v", key, err)
		ok = false
	} else {
		defer w.Close()
	}
	for _, t := range qwen2Tensors(cfg) {
		size.params += t.numel()
		if w == nil {
			continue
		}
		got, found := w.Lookup(t.name)
		switch {
		case !found:
			p.problem("%s: tensor %q is missing from the weights", key, t.name)
			ok = false
		case !slices.Equal(got.Shape, t.shape):
			p.problem("%s: %s: tensor %q has shape %v; config.json wants %v", key, got.Path(), t.name, got.Shape, t.shape)
			ok = false
		case hfmodel.DTypeSize[got.DType] == 0:
			p.problem("%s: %s: tensor %q has dtype %s (want F32, BF16 or F16)", key, got.Path(), t.name, got.DType)
			ok = false
		}
	}
	arch := fmt.Sprintf("Qwen2, %d parameters = %s (%d layers, hidden %d, %d/%d attention/KV heads, vocabulary %d), context %d",
		size.params, humanCount(size.params), cfg.NumHiddenLayers, cfg.HiddenSize, cfg.NumAttentionHeads, cfg.NumKeyValueHeads, cfg.VocabSize, cfg.MaxPositionEmbeddings)
	p.line("policy       %s", dir)
	p.line("             %s", arch)
	if tok != nil {
		p.line("tokenizer    %d ids", tok.VocabSize())
	}
	return size, ok
}

// tensorShape is one parameter of the policy.
type tensorShape struct {
	name  string
	shape []int64
}

func (t tensorShape) numel() int64 {
	n := int64(1)
	for _, d := range t.shape {
		n *= d
	}
	return n
}

// qwen2Tensors lists the parameters the policy loads for cfg, with their
// Hugging Face names and shapes (Qwen2ForCausalLM: biases on the q, k and v
// projections only; no lm_head when the embedding is tied).
func qwen2Tensors(cfg *hfmodel.Config) []tensorShape {
	h, hd := cfg.HiddenSize, cfg.HeadDimension()
	q, kv := cfg.NumAttentionHeads*hd, cfg.NumKeyValueHeads*hd
	out := []tensorShape{{"model.embed_tokens.weight", []int64{cfg.VocabSize, h}}}
	for i := range cfg.NumHiddenLayers {
		l := fmt.Sprintf("model.layers.%d.", i)
		out = append(out,
			tensorShape{l + "input_layernorm.weight", []int64{h}},
			tensorShape{l + "self_attn.q_proj.weight", []int64{q, h}},
			tensorShape{l + "self_attn.q_proj.bias", []int64{q}},
			tensorShape{l + "self_attn.k_proj.weight", []int64{kv, h}},
			tensorShape{l + "self_attn.k_proj.bias", []int64{kv}},
			tensorShape{l + "self_attn.v_proj.weight", []int64{kv, h}},
			tensorShape{l + "self_attn.v_proj.bias", []int64{kv}},
			tensorShape{l + "self_attn.o_proj.weight", []int64{h, q}},
			tensorShape{l + "post_attention_layernorm.weight", []int64{h}},
			tensorShape{l + "mlp.gate_proj.weight", []int64{cfg.IntermediateSize, h}},
			tensorShape{l + "mlp.up_proj.weight", []int64{cfg.IntermediateSize, h}},
			tensorShape{l + "mlp.down_proj.weight", []int64{h, cfg.IntermediateSize}},
		)
	}
	out = append(out, tensorShape{"model.norm.weight", []int64{h}})
	if !cfg.TieWordEmbeddings {
		out = append(out, tensorShape{"lm_head.weight", []int64{cfg.VocabSize, h}})
	}
	return out
}

// memoryPlan is the estimate of the policy's memory on its device, in bytes:
// the weights in policy.dtype, and for training the float32 gradient sums
// the micro-batches accumulate into (plus, for bfloat16, the bfloat16
// gradients of one backward before they are added in), a float32 master
// copy when the dtype is not float32 (the optimizer updates it), AdamW's two
// float32 moments and, when the algorithm's KL coefficient is > 0
// (config.Config.KLCoef), the frozen KL reference in policy.dtype.
// Activations and the KV cache come on top.
type memoryPlan struct {
	parts []struct {
		name  string
		bytes int64
	}
}

func (m *memoryPlan) add(name string, bytes int64) {
	m.parts = append(m.parts, struct {
		name  string
		bytes int64
	}{name, bytes})
}

func (m memoryPlan) total() int64 {
	var t int64
	for _, p := range m.parts {
		t += p.bytes
	}
	return t
}

func (m memoryPlan) String() string {
	var parts []string
	for _, p := range m.parts {
		parts = append(parts, fmt.Sprintf("%s %.3f", p.name, gib(p.bytes)))
	}
	return fmt.Sprintf("%.3f GiB = %s GiB", gib(m.total()), strings.Join(parts, " + "))
}

func gib(b int64) float64 { return float64(b) / (1 << 30) }

// planMemory plans training with cfg, or evaluation when cfg is nil.
func planMemory(params int64, pc config.Policy, cfg *config.Config) memoryPlan {
	elem := int64(4)
	if pc.DType == "bfloat16" {
		elem = 2
	}
	var m memoryPlan
	m.add("weights", params*elem)
	if cfg == nil {
		return m
	}
	m.add("float32 gradient sums", params*4)
	if elem != 4 {
		m.add("backward's gradients", params*elem)
		m.add("float32 master weights", params*4)
	}
	m.add("AdamW moments", params*8)
	if cfg.KLCoef() > 0 {
		m.add("KL reference", params*elem)
	}
	return m
}

func humanCount(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2f B", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.2f M", float64(n)/1e6)
	}
	return fmt.Sprint(n)
}

// checkTrainData loads each training dataset (the validation hold-out
// included) and reports its counts; every unreadable one is a problem.
func (p *preflight) checkTrainData(dc data.Config, show bool) {
	names, err := data.Expand(dc.Train)
	if err != nil {
		p.problem("data.train: %v", err)
		return
	}
	for _, ds := range names {
		one := dc
		one.Train = []string{ds}
		train, val, err := one.LoadTrain()
		if err != nil {
			p.problem("data: %s: %v", ds, err)
			continue
		}
		if show {
			path, _ := one.Path(ds, data.FileTrain)
			p.line("  %-10s train %6d  val %5d   %s", ds, len(train), len(val), path)
		}
	}
}

// checkTestData loads each test dataset and reports its counts.
func (p *preflight) checkTestData(dc data.Config) {
	names, err := data.Expand(dc.Test)
	if err != nil {
		p.problem("data.test: %v", err)
		return
	}
	for _, ds := range names {
		one := dc
		one.Test = []string{ds}
		qs, err := one.LoadTest()
		if err != nil {
			p.problem("data: %s: %v", ds, err)
			continue
		}
		path, _ := one.Path(ds, data.FileTest)
		p.line("  %-10s test  %6d   %s", ds, len(qs), path)
	}
}

// checkPool checks the pool's API-key variables (one problem per variable
// that is missing, naming the models that need it), its cache folder and
// the prompt template rendered with the pool's models.
func (p *preflight) checkPool(pc llmpool.Config, rc router.Config) {
	var infos []llmpool.ModelInfo
	needs := map[string][]string{} // variable → models
	var vars []string
	p.line("pool         %d models", len(pc.Models))
	for _, m := range pc.Models {
		infos = append(infos, llmpool.ModelInfo{Name: m.Name, Description: m.Description, PriceIn: m.PriceIn,
			PriceOut: m.PriceOut, Provider: m.Provider, Simulated: m.Provider == "sim"})
		where := m.Provider
		if m.OpenAI != nil {
			where = fmt.Sprintf("%s %s at %s", m.Provider, m.OpenAI.Model, m.OpenAI.BaseURL)
			if v := m.OpenAI.APIKeyEnv; v != "" {
				if key, ok := os.LookupEnv(v); !ok || strings.TrimSpace(key) == "" {
					if _, seen := needs[v]; !seen {
						vars = append(vars, v)
					}
					needs[v] = append(needs[v], m.Name)
					where += ", key $" + v + " NOT SET"
				} else {
					where += ", key $" + v + " set"
				}
			}
		}
		p.line("  %-24s %s (USD %.2f/%.2f per M tokens in/out)", m.Name, where, m.PriceIn, m.PriceOut)
	}
	for _, v := range vars {
		p.problem("pool: environment variable %s is not set (api_key_env of %s)", v, strings.Join(needs[v], ", "))
	}
	switch pc.Cache {
	case llmpool.CacheOff:
		p.line("  cache off")
	case llmpool.CacheReadOnly:
		if st, err := os.Stat(pc.CacheDir); err != nil || !st.IsDir() {
			p.problem("pool.cache_dir: %s is not a folder, and pool.cache is read-only, so it must exist", pc.CacheDir)
		}
		p.line("  cache read-only from %s", pc.CacheDir)
	default:
		p.checkCreatable("pool.cache_dir", pc.CacheDir)
		p.line("  cache %s in %s", pc.Cache, pc.CacheDir)
	}
	if _, err := router.NewPrompt(rc.PromptTemplate, infos, rc.MaxTurns); err != nil {
		p.problem("router.prompt_template: %v", err)
	}
	p.line("prompt       %s (%d pool calls, %d tokens a turn)", rc.PromptTemplate, rc.MaxTurns, rc.TurnTokens)
}

// checkCreatable reports a problem unless dir is a folder or could be
// created: its nearest existing ancestor is a folder. Nothing is created.
func (p *preflight) checkCreatable(key, dir string) {
	for d := dir; ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err == nil {
			if !st.IsDir() {
				p.problem("%s: %s cannot be created: %s is not a folder", key, dir, d)
			}
			return
		}
		if !errors.Is(err, os.ErrNotExist) {
			p.problem("%s: %v", key, err)
			return
		}
		if d == filepath.Dir(d) {
			p.problem("%s: %s cannot be created", key, dir)
			return
		}
	}
}

// dryRunTrain is `recal train --dry-run`.
func dryRunTrain(w io.Writer, cfg config.Config, configPath, runDir string, resume bool) error {
	p := &preflight{command: "train"}
	p.line("config       %s", configPath)
	size, _ := p.checkPolicy("policy.checkpoint", cfg.Policy.Checkpoint)
	p.line("device       %s, %s", cfg.Policy.Device, cfg.Policy.DType)
	if size.cfg != nil {
		p.line("memory       %s, on %s for training (activations and the KV cache come on top)",
			planMemory(size.params, cfg.Policy, &cfg), cfg.Policy.Device)
	}
	p.line("data         %s", cfg.Data.Dir)
	p.checkTrainData(cfg.Data, true)
	p.checkPool(cfg.Pool, cfg.Router)
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
	if size.cfg != nil {
		p.line("memory       %s, on %s (the policy only; the KV cache of eval.batch = %d questions comes on top)",
			planMemory(size.params, cfg.Policy, nil), cfg.Policy.Device, cfg.Eval.Batch)
	}
	p.line("data         %s", cfg.Data.Dir)
	p.checkTestData(cfg.Data)
	p.checkTrainData(cfg.Data, false) // the simulated models' answer bank reads them
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
