// Package preflight checks everything a command would use, without loading
// weights into libtorch, calling a model or creating anything: a policy
// checkpoint's config.json, tokenizer and safetensors headers, the data
// files (loaded and counted), the prompt template, the pool's API-key
// variables and cache folder, the folders a command would create, and the
// memory plan of the job on its device (memory.go). The dry runs of
// `recal train`, `recal eval` and `recal serve` (--dry-run) are made of
// these checks: each adds a line to a summary or a problem, and Finish
// prints the summary or returns every problem at once.
package preflight

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/internal/tokenizer"
	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/router"
)

// Error is the problems a dry run found, each a line naming what is wrong.
type Error struct {
	Command  string // "train", "eval", …
	Problems []string
}

func (e *Error) Error() string {
	noun := "problems"
	if len(e.Problems) == 1 {
		noun = "problem"
	}
	return fmt.Sprintf("%s --dry-run: %d %s:\n  %s", e.Command, len(e.Problems), noun, strings.Join(e.Problems, "\n  "))
}

// Check collects what a dry run finds.
type Check struct {
	command  string
	problems []string
	summary  strings.Builder

	// What the checks found that later ones use (the memory plan).
	tok      *tokenizer.Tokenizer
	prompt   *router.Prompt
	longest  string // the longest training question, by characters
	ctxLen   int64  // the policy's context (max_position_embeddings)
	capacity int    // a rollout row's response tokens (router.Config.Capacity)

	readDevice ReadDevice // a GPU's memory, for the memory plan's verdict (ReadDeviceWith)
}

// ReadDeviceWith has the memory plan read a GPU's total memory with read
// when policy.device_memory is not set.
func (c *Check) ReadDeviceWith(read ReadDevice) { c.readDevice = read }

// New starts the dry run of command ("train", "eval", …).
func New(command string) *Check { return &Check{command: command} }

// Problem records a problem.
func (c *Check) Problem(format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf(format, args...))
}

// Line adds a line to the summary.
func (c *Check) Line(format string, args ...any) {
	fmt.Fprintf(&c.summary, format+"\n", args...)
}

// Problems are the problems found so far.
func (c *Check) Problems() []string { return slices.Clone(c.problems) }

// Finish prints the summary to w and returns nil, or returns every problem
// as an *Error.
func (c *Check) Finish(w io.Writer) error {
	if len(c.problems) > 0 {
		return &Error{Command: c.command, Problems: slices.Clone(c.problems)}
	}
	fmt.Fprint(w, c.summary.String())
	fmt.Fprintf(w, "%s --dry-run: no problem found; nothing was loaded into libtorch or written\n", c.command)
	return nil
}

// Policy is the shape of a checkpoint as the dry run reads it.
type Policy struct {
	Config *hfmodel.Config
	Params int64
}

// Policy checks a checkpoint folder without loading it into libtorch:
// config.json, the tokenizer (and that its ids fit the vocabulary), the
// end-of-sequence ids, and every tensor the policy needs in the safetensors
// headers (name, shape and dtype), against hfmodel.Config.Params. key names
// the setting or flag that named dir. The zero Policy (and false) when
// config.json cannot be read.
func (c *Check) Policy(key, dir string) (Policy, bool) {
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		c.Problem("%s: %s does not exist (a Hugging Face checkpoint folder: config.json, model.safetensors, tokenizer.json)", key, dir)
		return Policy{}, false
	case err != nil:
		c.Problem("%s: %v", key, err)
		return Policy{}, false
	case !st.IsDir():
		c.Problem("%s: %s is not a folder", key, dir)
		return Policy{}, false
	}
	ok := true
	tok, err := tokenizer.Load(dir)
	if err != nil {
		c.Problem("%s: %v", key, err)
		ok = false
	}
	cfg, err := hfmodel.LoadConfig(dir)
	if err != nil {
		c.Problem("%s: %v", key, err)
		return Policy{}, false
	}
	if tok != nil && int64(tok.VocabSize()) > cfg.VocabSize {
		c.Problem("%s: the tokenizer has %d ids but config.json's vocab_size is %d", key, tok.VocabSize(), cfg.VocabSize)
		ok = false
	}
	if _, err := hfmodel.EOS(dir, cfg); err != nil {
		c.Problem("%s: %v", key, err)
		ok = false
	}
	if c.tok == nil {
		c.tok, c.ctxLen = tok, cfg.MaxPositionEmbeddings
	}
	size := Policy{Config: cfg}
	w, err := hfmodel.OpenWeights(dir)
	if err != nil {
		c.Problem("%s: %v", key, err)
		ok = false
	} else {
		defer w.Close()
	}
	size.Params = cfg.NumParams()
	if w != nil {
		// The loader's own check (torchbridge.LoadPolicy runs it before
		// allocating), its first maxTensorProblems lines: a hostile
		// config.json can fail every tensor of a thousand layers.
		bad := w.Mismatches(cfg)
		for i, p := range bad {
			if i == maxTensorProblems {
				c.Problem("%s: … and %d more tensors that config.json wants differ from the weights", key, len(bad)-i)
				break
			}
			c.Problem("%s: %s", key, p)
		}
		ok = ok && len(bad) == 0
		if len(bad) == 0 {
			// What the loader checks too: every weight finite.
			for _, t := range cfg.Params() {
				got, _ := w.Lookup(t.Name)
				if err := w.CheckFinite(got); err != nil {
					c.Problem("%s: %v", key, err)
					ok = false
					break
				}
			}
		}
	}
	var sums string // the summary's line on the checksums
	switch names, err := hfmodel.VerifyChecksums(dir, hfmodel.PolicyFile); {
	case errors.Is(err, hfmodel.ErrNoChecksums):
		sums = "none: a checkpoint from elsewhere, its files cannot be checked for corruption"
	case err != nil:
		c.Problem("%s: %v", key, err)
		ok = false
	default:
		sums = fmt.Sprintf("%d files match %s", len(names), hfmodel.ChecksumFile)
	}
	arch := fmt.Sprintf("Qwen2, %d parameters = %s (%d layers, hidden %d, %d/%d attention/KV heads, vocabulary %d), context %d",
		size.Params, HumanCount(size.Params), cfg.NumHiddenLayers, cfg.HiddenSize, cfg.NumAttentionHeads, cfg.NumKeyValueHeads, cfg.VocabSize, cfg.MaxPositionEmbeddings)
	c.Line("policy       %s", dir)
	c.Line("             %s", arch)
	if tok != nil {
		c.Line("tokenizer    %d ids", tok.VocabSize())
	}
	if sums != "" {
		c.Line("checksums    %s", sums)
	}
	return size, ok
}

// maxTensorProblems is the most tensor problems of one checkpoint a dry run
// lists, one line each.
const maxTensorProblems = 10

// HumanCount writes a parameter count in millions or billions.
func HumanCount(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2f B", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.2f M", float64(n)/1e6)
	}
	return fmt.Sprint(n)
}

// TrainData loads each training dataset (the validation hold-out included)
// and, with show, reports its counts; every unreadable one is a problem.
func (c *Check) TrainData(dc data.Config, show bool) {
	names, err := data.Expand(dc.Train)
	if err != nil {
		c.Problem("data.train: %v", err)
		return
	}
	for _, ds := range names {
		one := dc
		one.Train = []string{ds}
		train, val, err := one.LoadTrain()
		if err != nil {
			c.Problem("data: %s: %v", ds, err)
			continue
		}
		for _, ex := range train {
			if len(ex.Question) > len(c.longest) {
				c.longest = ex.Question
			}
		}
		if show {
			path, _ := one.Path(ds, data.FileTrain)
			c.Line("  %-10s train %6d  val %5d   %s", ds, len(train), len(val), path)
		}
	}
}

// TestData loads each test dataset and reports its counts.
func (c *Check) TestData(dc data.Config) {
	names, err := data.Expand(dc.Test)
	if err != nil {
		c.Problem("data.test: %v", err)
		return
	}
	for _, ds := range names {
		one := dc
		one.Test = []string{ds}
		qs, err := one.LoadTest()
		if err != nil {
			c.Problem("data: %s: %v", ds, err)
			continue
		}
		for _, ex := range qs {
			if len(ex.Question) > len(c.longest) {
				c.longest = ex.Question
			}
		}
		path, _ := one.Path(ds, data.FileTest)
		c.Line("  %-10s test  %6d   %s", ds, len(qs), path)
	}
}

// Pool checks the pool's API-key variables (one problem per variable that
// is missing, naming the models that need it), its cache folder and the
// prompt template rendered with the pool's models.
func (c *Check) Pool(pc llmpool.Config, rc router.Config) {
	var infos []llmpool.ModelInfo
	needs := map[string][]string{} // variable → models
	why := map[string]error{}      // variable → what is wrong with it
	var vars []string
	c.Line("pool         %d models", len(pc.Models))
	for _, m := range pc.Models {
		infos = append(infos, llmpool.ModelInfo{Name: m.Name, Description: m.Description, PriceIn: m.PriceIn,
			PriceOut: m.PriceOut, Provider: m.Provider, Simulated: m.Provider == "sim"})
		where := m.Provider
		if m.OpenAI != nil {
			where = fmt.Sprintf("%s %s at %s", m.Provider, m.OpenAI.Model, m.OpenAI.BaseURL)
			if v := m.OpenAI.APIKeyEnv; v != "" {
				if _, err := llmpool.APIKey(v, os.LookupEnv); err != nil {
					if _, seen := needs[v]; !seen {
						vars = append(vars, v)
					}
					needs[v] = append(needs[v], m.Name)
					why[v] = err
					where += ", key $" + v + " NOT USABLE"
				} else {
					where += ", key $" + v + " set"
				}
			}
		}
		c.Line("  %-24s %s (USD %.2f/%.2f per M tokens in/out)", m.Name, where, m.PriceIn, m.PriceOut)
	}
	for _, v := range vars {
		c.Problem("pool: %v (the key of %s)", why[v], strings.Join(needs[v], ", "))
	}
	switch pc.Cache {
	case llmpool.CacheOff:
		c.Line("  cache off")
	case llmpool.CacheReadOnly:
		if st, err := os.Stat(pc.CacheDir); err != nil || !st.IsDir() {
			c.Problem("pool.cache_dir: %s is not a folder, and pool.cache is read-only, so it must exist", pc.CacheDir)
		}
		c.Line("  cache read-only from %s", pc.CacheDir)
	default:
		c.Creatable("pool.cache_dir", pc.CacheDir)
		c.Line("  cache %s in %s", pc.Cache, pc.CacheDir)
	}
	p, err := router.NewPrompt(rc.PromptTemplate, infos, rc.MaxTurns)
	if err != nil {
		c.Problem("router.prompt_template: %v", err)
	} else {
		c.prompt = p
	}
	c.capacity = rc.Capacity()
	c.Line("prompt       %s (%d pool calls, %d tokens a turn)", rc.PromptTemplate, rc.MaxTurns, rc.TurnTokens)
}

// Creatable reports a problem unless dir is a folder or could be created:
// its nearest existing ancestor is a folder. Nothing is created.
func (c *Check) Creatable(key, dir string) {
	for d := dir; ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err == nil {
			if !st.IsDir() {
				c.Problem("%s: %s cannot be created: %s is not a folder", key, dir, d)
			}
			return
		}
		if !errors.Is(err, os.ErrNotExist) {
			c.Problem("%s: %v", key, err)
			return
		}
		if d == filepath.Dir(d) {
			c.Problem("%s: %s cannot be created", key, dir)
			return
		}
	}
}
