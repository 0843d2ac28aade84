package main

import (
	"context"
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
	"github.com/urfave/cli/v3"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/rollout"
	"github.com/recal-project/recal/tokenizer"
	"github.com/recal-project/recal/torchbridge"
	"github.com/recal-project/recal/trainer"
)

func policyCommand() *cli.Command {
	return &cli.Command{
		Name:  "policy",
		Usage: "create policy checkpoints",
		Commands: []*cli.Command{{
			Name:  "init",
			Usage: "write a randomly initialised Qwen2-architecture checkpoint (Hugging Face format)",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "preset", Value: "tiny", Usage: "tiny (2 layers, hidden 128) or small (4 layers, hidden 256)"},
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
	tokPath := cmd.String("tokenizer")
	tok, err := tokenizer.Load(tokPath)
	if err != nil {
		return err
	}
	var trimmed *tokenizer.Trimmed
	if paths := cmd.StringSlice("trim-corpus"); len(paths) > 0 {
		corpus, err := trimCorpus(paths)
		if err != nil {
			return err
		}
		if trimmed, err = tok.Trim(corpus, int(cmd.Int("trim-vocab"))); err != nil {
			return err
		}
		slog.Info("tokenizer trimmed", "texts", len(corpus), "vocab", trimmed.VocabSize)
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
	cfg, err := hfmodel.Preset(cmd.String("preset"), vocab)
	if err != nil {
		return usageError{err}
	}
	var eos []int64
	for _, id := range tok.StopIDs() {
		eos = append(eos, int64(id))
	}
	cfg.EOSTokenIDs = eos
	if err := rollout.SetThreads(int(cmd.Root().Int("threads"))); err != nil {
		return err
	}
	p, err := torchbridge.NewPolicy(cfg, torchbridge.Options{})
	if err != nil {
		return err
	}
	defer p.Close()
	if err := p.InitRandom(cmd.Uint64("seed"), cmd.Float("init-std")); err != nil {
		return err
	}
	if cmd.Bool("copy-circuit") {
		if err := writeCopyCircuit(p, cfg, cmd.Uint64("seed")); err != nil {
			return err
		}
	}
	dir := tokPath
	if st, err := os.Stat(tokPath); err == nil && !st.IsDir() {
		dir = filepath.Dir(tokPath)
	}
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		if b, err := os.ReadFile(filepath.Join(dir, f)); err == nil {
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
	if err := p.Save(cmd.String("out")); err != nil {
		return err
	}
	slog.Info("policy initialised", "preset", cmd.String("preset"), "params", p.NumParams(), "out", cmd.String("out"))
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
	corpus := []string{trainer.ProtocolText}
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
				b, err := os.ReadFile(path)
				if err != nil {
					return err
				}
				corpus = append(corpus, string(b))
			case ".toml":
				var v map[string]any
				if _, err := toml.DecodeFile(path, &v); err != nil {
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
