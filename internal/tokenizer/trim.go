package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/recal-project/recal/internal/inputfile"
)

// Trimmed is a tokenizer restricted to the tokens a corpus needs.
type Trimmed struct {
	TokenizerJSON []byte // the new tokenizer.json
	ConfigJSON    []byte // the new tokenizer_config.json (nil when the source has none)
	VocabSize     int    // ids in the new tokenizer, added tokens included
}

// Save writes the trimmed tokenizer's files into dir (tokenizer_config.json
// only when the source had one), ready for Load.
func (tr *Trimmed) Save(dir string) error {
	if err := os.WriteFile(filepath.Join(dir, TokenizerFile), tr.TokenizerJSON, 0o644); err != nil {
		return fmt.Errorf("tokenizer: trim: %w", err)
	}
	if tr.ConfigJSON != nil {
		if err := os.WriteFile(filepath.Join(dir, ConfigFile), tr.ConfigJSON, 0o644); err != nil {
			return fmt.Errorf("tokenizer: trim: %w", err)
		}
	}
	return nil
}

// Trim writes a smaller byte-level BPE tokenizer that encodes every text of
// corpus into exactly the same token strings as t does, with dense new ids.
// It keeps the single-byte tokens (so any text still encodes), the added
// tokens, every token t produces on the corpus, and recursively the parts of
// every merge that produces a kept token; a merge survives when its two
// parts and its result are kept, in its original order. Text outside the
// corpus encodes into more, shorter tokens. Used to give a small offline
// policy a vocabulary in proportion to its size; the files are ordinary
// Hugging Face tokenizer files.
//
// Added tokens (the chat template's markers among them) are always kept, with
// their special flags. The corpus is counted as Encode reads it; a question
// or reply that writes an added token is encoded plain by recal
// (EncodePlain), and its pieces then take the kept tokens they can: more,
// shorter ones, never a control token.
//
// maxVocab > 0 caps the vocabulary (added tokens not counted): the corpus's
// tokens are taken from the most frequent down, each with the parts it is
// merged from, while they fit. Rarer words then encode into several kept
// pieces, so the corpus no longer keeps its exact token strings. A small
// model trained from scratch then sees every kept token often enough to
// learn its embedding, which copying a rare name out of the prompt needs.
func (t *Tokenizer) Trim(corpus []string, maxVocab int) (*Trimmed, error) {
	src, err := inputfile.ReadFile(t.path, inputfile.TextLimit)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: trim: %w", err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(src, &top); err != nil {
		return nil, fmt.Errorf("tokenizer: trim: %s: %w", t.path, err)
	}
	var model map[string]json.RawMessage
	if err := json.Unmarshal(top["model"], &model); err != nil {
		return nil, fmt.Errorf("tokenizer: trim: %s: model: %w", t.path, err)
	}
	var vocab map[string]int
	if err := json.Unmarshal(model["vocab"], &vocab); err != nil {
		return nil, fmt.Errorf("tokenizer: trim: %s: model.vocab: %w", t.path, err)
	}
	merges, err := parseMerges(model["merges"])
	if err != nil {
		return nil, fmt.Errorf("tokenizer: trim: %s: model.merges%w", t.path, err)
	}
	byID := make(map[int]string, len(vocab))
	for s, id := range vocab {
		byID[id] = s
	}
	producers := map[string][][2]string{}
	for _, m := range merges {
		producers[m[0]+m[1]] = append(producers[m[0]+m[1]], m)
	}
	keep := map[string]bool{}
	for s := range vocab {
		if utf8.RuneCountInString(s) == 1 {
			keep[s] = true
		}
	}
	// parts returns s and, recursively, the parts of every merge producing
	// it that are not kept yet.
	parts := func(s string) []string {
		out := []string{s}
		seen := map[string]bool{s: true}
		for i := 0; i < len(out); i++ {
			for _, m := range producers[out[i]] {
				for _, p := range m {
					if !keep[p] && !seen[p] {
						seen[p] = true
						out = append(out, p)
					}
				}
			}
		}
		return out
	}
	commit := func(xs []string) {
		for _, x := range xs {
			keep[x] = true
		}
	}
	count := map[string]int{}
	var order []string // the corpus's tokens in order of first appearance
	for _, text := range corpus {
		for _, id := range t.Encode(text) {
			if s, ok := byID[id]; ok {
				if count[s] == 0 {
					order = append(order, s)
				}
				count[s]++
			}
		}
	}
	if maxVocab > 0 {
		sort.SliceStable(order, func(i, j int) bool { return count[order[i]] > count[order[j]] })
	}
	for _, s := range order {
		if keep[s] {
			continue
		}
		xs := parts(s)
		if maxVocab > 0 && len(keep)+len(xs) > maxVocab {
			break
		}
		commit(xs)
	}
	kept := make([]string, 0, len(keep))
	for s := range keep {
		kept = append(kept, s)
	}
	sort.Slice(kept, func(i, j int) bool { return vocab[kept[i]] < vocab[kept[j]] })
	newVocab := make(map[string]int, len(kept))
	for i, s := range kept {
		newVocab[s] = i
	}
	var newMerges []string
	for _, m := range merges {
		if keep[m[0]] && keep[m[1]] && keep[m[0]+m[1]] {
			newMerges = append(newMerges, m[0]+" "+m[1])
		}
	}
	// Added tokens follow the vocabulary, in their original order.
	var added []map[string]any
	if raw, ok := top["added_tokens"]; ok && !isNull(raw) {
		if err := json.Unmarshal(raw, &added); err != nil {
			return nil, fmt.Errorf("tokenizer: trim: %s: added_tokens: %w", t.path, err)
		}
	}
	sort.SliceStable(added, func(i, j int) bool { return num(added[i]["id"]) < num(added[j]["id"]) })
	remap := map[int]int{}
	for i, a := range added {
		remap[int(num(a["id"]))] = len(kept) + i
		a["id"] = len(kept) + i
	}
	if model["vocab"], err = marshal(newVocab); err != nil {
		return nil, err
	}
	if model["merges"], err = marshal(newMerges); err != nil {
		return nil, err
	}
	if top["model"], err = marshal(model); err != nil {
		return nil, err
	}
	if added != nil {
		if top["added_tokens"], err = marshal(added); err != nil {
			return nil, err
		}
	}
	out := &Trimmed{VocabSize: len(kept) + len(added)}
	if out.TokenizerJSON, err = marshal(top); err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(filepath.Dir(t.path), ConfigFile)
	if b, err := inputfile.ReadFile(cfgPath, inputfile.ConfigLimit); err == nil {
		var cfg map[string]json.RawMessage
		if err := json.Unmarshal(b, &cfg); err != nil {
			return nil, fmt.Errorf("tokenizer: trim: %s: %w", cfgPath, err)
		}
		if raw, ok := cfg["added_tokens_decoder"]; ok {
			var dec map[string]json.RawMessage
			if err := json.Unmarshal(raw, &dec); err != nil {
				return nil, fmt.Errorf("tokenizer: trim: %s: added_tokens_decoder: %w", cfgPath, err)
			}
			nd := map[string]json.RawMessage{}
			for k, v := range dec {
				old, err := strconv.Atoi(k)
				if err != nil {
					return nil, fmt.Errorf("tokenizer: trim: %s: added_tokens_decoder key %q", cfgPath, k)
				}
				if id, ok := remap[old]; ok {
					nd[strconv.Itoa(id)] = v
				}
			}
			if cfg["added_tokens_decoder"], err = marshal(nd); err != nil {
				return nil, err
			}
		}
		if out.ConfigJSON, err = marshal(cfg); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func num(v any) float64 {
	f, _ := v.(float64)
	if i, ok := v.(int); ok {
		return float64(i)
	}
	return f
}

// marshal encodes JSON without HTML escaping (tokens such as "<|im_end|>"
// stay readable).
func marshal(v any) (json.RawMessage, error) {
	var b bytes.Buffer
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	if err := e.Encode(v); err != nil {
		return nil, fmt.Errorf("tokenizer: trim: %w", err)
	}
	return json.RawMessage(strings.TrimSuffix(b.String(), "\n")), nil
}
