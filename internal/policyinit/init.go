// Package policyinit writes randomly initialised Qwen2-architecture
// checkpoints (recal policy init): a preset's shapes, a tokenizer
// optionally trimmed to the tokens of a corpus, and optionally a copy
// (induction) circuit in the first layers, so that a tiny policy trained
// from scratch can copy a reply's answer. The offline default's starting
// policy (runs/init/tiny, made by `make`) is one.
package policyinit

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/internal/inputfile"
	"github.com/recal-project/recal/internal/tokenizer"
	"github.com/recal-project/recal/router"
	"github.com/recal-project/recal/torchbridge"
)

// Options say what Init writes.
type Options struct {
	Preset    string // hfmodel.Preset: "tiny" or "small"
	Tokenizer string // tokenizer.json, or a folder holding it and tokenizer_config.json
	Out       string // output folder (replaced if it exists)
	Seed      uint64 // initialisation seed
	InitStd   float64
	// CopyCircuit writes hfmodel.CopyCircuit into the first two layers.
	CopyCircuit bool
	// TrimCorpus, if set, trims the tokenizer to the tokens of these files
	// or folders (trimCorpus), keeping at most TrimVocab of them (0 = all).
	TrimCorpus []string
	TrimVocab  int
	Log        *slog.Logger
}

// Init writes a randomly initialised checkpoint as o says.
func Init(o Options) error {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	tokPath := o.Tokenizer
	tok, err := tokenizer.Load(tokPath)
	if err != nil {
		return err
	}
	var trimmed *tokenizer.Trimmed
	if paths := o.TrimCorpus; len(paths) > 0 {
		corpus, err := trimCorpus(paths)
		if err != nil {
			return err
		}
		if trimmed, err = tok.Trim(corpus, o.TrimVocab); err != nil {
			return err
		}
		o.Log.Info("tokenizer trimmed", "texts", len(corpus), "vocab", trimmed.VocabSize)
		dir, err := os.MkdirTemp("", "recal-tok-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if err := trimmed.Save(dir); err != nil {
			return err
		}
		if tok, err = tokenizer.Load(dir); err != nil {
			return err
		}
		tokPath = dir
	}
	// Qwen2.5 pads its 151,665 ids to 151,936 embedding rows; keep that
	// size so checkpoints match the real models' shapes. A trimmed
	// vocabulary is padded to a multiple of 64.
	vocab := int64(151936)
	if v := int64(tok.VocabSize()); trimmed != nil || v > vocab {
		vocab = (v + 63) / 64 * 64
	}
	cfg, err := hfmodel.Preset(o.Preset, vocab)
	if err != nil {
		return err
	}
	var eos []int64
	for _, id := range tok.StopIDs() {
		eos = append(eos, int64(id))
	}
	cfg.EOSTokenIDs = eos
	p, err := torchbridge.NewPolicy(cfg, torchbridge.Options{})
	if err != nil {
		return err
	}
	defer p.Close()
	if err := p.InitRandom(o.Seed, o.InitStd); err != nil {
		return err
	}
	if o.CopyCircuit {
		if err := writeCopyCircuit(p, cfg, o.Seed); err != nil {
			return err
		}
	}
	dir := tokPath
	if st, err := os.Stat(tokPath); err == nil && !st.IsDir() {
		dir = filepath.Dir(tokPath)
	}
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		if b, err := inputfile.ReadFile(filepath.Join(dir, f), inputfile.TextLimit); err == nil {
			p.Aux[f] = b
		}
	}
	if trimmed != nil {
		p.Aux["tokenizer.json"], p.Aux["tokenizer_config.json"] = trimmed.TokenizerJSON, trimmed.ConfigJSON
	}
	gen := map[string]any{"eos_token_id": eos, "do_sample": false}
	if tok.PadID() >= 0 {
		gen["pad_token_id"] = tok.PadID()
	}
	gb, _ := json.MarshalIndent(gen, "", "  ")
	p.Aux["generation_config.json"] = append(gb, '\n')
	if err := p.Save(o.Out); err != nil {
		return err
	}
	o.Log.Info("policy initialised", "preset", o.Preset, "params", p.NumParams(), "out", o.Out)
	return nil
}

// writeCopyCircuit writes hfmodel.CopyCircuit into the policy's weights.
func writeCopyCircuit(p *torchbridge.Policy, cfg *hfmodel.Config, seed uint64) error {
	w := map[string][]float32{}
	for _, prm := range p.Params() {
		buf := make([]byte, 4*prm.Numel())
		if err := p.GetParam(prm.Name, "F32", buf); err != nil {
			return err
		}
		vals := make([]float32, prm.Numel())
		for i := range vals {
			vals[i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))
		}
		w[prm.Name] = vals
	}
	if err := hfmodel.CopyCircuit(cfg, w, seed); err != nil {
		return err
	}
	for _, prm := range p.Params() {
		buf := make([]byte, 4*prm.Numel())
		for i, x := range w[prm.Name] {
			binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(x))
		}
		if err := p.SetParam(prm.Name, "F32", buf); err != nil {
			return err
		}
	}
	return nil
}

// trimCorpus gathers the texts a trimmed tokenizer must encode compactly:
// questions and answers of QA files (.jsonl, .parquet), the text of .tmpl
// and .txt files, the string values of .toml files (model names and
// descriptions; not comments, so editing a comment does not change the
// vocabulary), and the protocol's own strings; other files are skipped.
func trimCorpus(paths []string) ([]string, error) {
	corpus := []string{router.ProtocolText}
	for _, root := range paths {
		err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				return nil
			}
			switch ext := filepath.Ext(path); ext {
			case ".jsonl", ".parquet":
				exs, err := data.LoadFile(path, data.LoadOptions{})
				if err != nil {
					return err
				}
				for _, ex := range exs {
					corpus = append(corpus, ex.Question, strings.Join(ex.Golden, "\n"))
				}
			case ".tmpl", ".txt":
				b, err := inputfile.ReadFile(path, inputfile.TextLimit)
				if err != nil {
					return err
				}
				corpus = append(corpus, string(b))
			case ".toml":
				var v map[string]any
				b, err := inputfile.ReadFile(path, inputfile.ConfigLimit)
				if err != nil {
					return err
				}
				if _, err := toml.Decode(string(b), &v); err != nil {
					return fmt.Errorf("%s: %w", path, err)
				}
				corpus = append(corpus, tomlStrings(v, nil)...)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("--trim-corpus: %w", err)
		}
	}
	return corpus, nil
}

// tomlStrings appends every string value in v (tables and arrays included),
// in a fixed order.
func tomlStrings(v any, out []string) []string {
	switch x := v.(type) {
	case string:
		out = append(out, x)
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(x)) {
			out = tomlStrings(x[k], out)
		}
	case []map[string]any:
		for _, e := range x {
			out = tomlStrings(e, out)
		}
	case []any:
		for _, e := range x {
			out = tomlStrings(e, out)
		}
	}
	return out
}
