package eval

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/recal-project/recal/internal/atomicfile"
	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/router"
	"github.com/recal-project/recal/torchbridge"
)

// A results file holds the answers of one router under one set of inputs.
// Its identity, results-<router>.id.json beside it, names the router and
// digests the inputs that decide its answers: for each router, the parts
// its Spec lists (see inputParts). A rerun into the same folder resumes
// the file only when the identity is the same; otherwise the file and its
// identity are moved aside as results-<router>.<first 12 hex of its id>.jsonl
// (and .id.json), never mixed with the new answers nor deleted, and an
// earlier file moved aside under the new identity is taken back. So
// evaluating checkpoints/step-150 and then checkpoints/last into one --out
// gives each its own answers, and the baseline routers, which do not read
// the checkpoint, are not asked again.
//
// Not in the identity, on purpose: the pool's cache mode and folder,
// concurrency, timeouts, retries, rate limits, API-key variables and
// simulated latency. eval.batch, the ranks and the threads are in it only
// for a policy whose decoding is not row-invariant (bfloat16, CUDA: a row's
// logits there depend on the rows decoded with it); a float32 policy on the
// CPU gives the same answers whatever they are.
type identity struct {
	ID     string                     `json:"id"` // sha256 of Router and Inputs
	Router string                     `json:"router"`
	Inputs map[string]json.RawMessage `json:"inputs"`
}

// inputParts computes each part a router's identity can name.
var inputParts = map[string]func(s Setup) (any, error){
	// checkpoint: the sha256 of the checkpoint's files (see CheckpointDigest).
	"checkpoint": func(s Setup) (any, error) {
		if s.Env == nil || s.Env.Engine == nil {
			return nil, errors.New("eval: no policy to evaluate")
		}
		return CheckpointDigest(s.Env.Engine.Dir)
	},
	// policy: the dtype and device kind the policy runs in, and for a
	// policy whose rows depend on the rows decoded with them, how they are
	// batched: eval.batch, the ranks and the CPU threads.
	"policy": func(s Setup) (any, error) {
		if s.Env == nil || s.Env.Engine == nil {
			return nil, errors.New("eval: no policy to evaluate")
		}
		o := s.Env.Engine.Policy.Options()
		device, _, _ := strings.Cut(o.Device, ":") // cuda:0 and cuda:1 compute alike
		invariant, err := s.Env.Engine.Policy.RowInvariant()
		if err != nil {
			return nil, err
		}
		type batching struct{ Batch, Ranks, Threads int }
		var b *batching
		if !invariant {
			ranks := 1
			if s.Group != nil {
				ranks = s.Group.Size()
			}
			threads, err := torchbridge.Threads()
			if err != nil {
				return nil, err
			}
			if s.Env.DecodeThreads > 0 {
				threads = s.Env.DecodeThreads
			}
			b = &batching{s.Batch, ranks, threads}
		}
		return struct {
			DType, Device string
			Batching      *batching `json:",omitempty"`
		}{o.DType, device, b}, nil
	},
	// router: the protocol's limits and the prompt template's text.
	"router": func(s Setup) (any, error) {
		rc := s.Env.Router
		tmpl, err := fileDigest(rc.PromptTemplate)
		if err != nil {
			return nil, err
		}
		agreement := 0
		if rc.Agreement {
			agreement = router.AgreementVersion
		}
		onRepeat := "" // "ban" (or unset), as results made before on_repeat existed
		if rc.NoRepeatNGram > 0 && rc.OnRepeat == router.OnRepeatClose {
			onRepeat = rc.OnRepeat
		}
		return struct {
			MaxTurns, TurnTokens, InfoTokens int
			Prompt                           string
			NoRepeatNGram                    int     `json:",omitempty"`
			OnRepeat                         string  `json:",omitempty"`
			AnswerSpan                       bool    `json:",omitempty"`
			AnswerWhole                      bool    `json:",omitempty"`
			SearchNames                      bool    `json:",omitempty"`
			CallFirst                        bool    `json:",omitempty"`
			FinalAnswer                      bool    `json:",omitempty"`
			MatchClose                       bool    `json:",omitempty"`
			Agreement                        int     `json:",omitempty"` // router.AgreementVersion when on
			Budget                           float64 `json:",omitempty"` // Env.MaxCostUSD
			Engine                           int     `json:",omitempty"`
		}{rc.MaxTurns, rc.TurnTokens, rc.InfoTokens, tmpl, rc.NoRepeatNGram, onRepeat, rc.AnswerSpan, rc.AnswerWhole, rc.SearchNames, rc.CallFirst, rc.FinalAnswer, rc.MatchClose,
			agreement, s.Env.MaxCostUSD, router.DecodeVersion}, nil
	},
	// pool: the models as configured, less the settings that change how
	// calls are made but not what they answer.
	"pool": func(s Setup) (any, error) {
		if len(s.Pool.Models) == 0 {
			return nil, errors.New("eval: Setup.Pool is not set; the pool's configuration keys the results")
		}
		models := make([]llmpool.ModelConfig, len(s.Pool.Models))
		replay := 0 // the replay rule's version (llmpool.ReplayVersion), when a model is replayed
		for i, m := range s.Pool.Models {
			if m.Replay != nil {
				replay = llmpool.ReplayVersion
			}
			models[i] = m.WithoutOperational()
		}
		return struct {
			Models        []llmpool.ModelConfig
			MaxQueryChars int
			FailureText   string
			Replay        int `json:",omitempty"`
		}{models, s.Pool.MaxQueryChars, s.Pool.FailureText, replay}, nil
	},
	// cot: the protocol's limits and the chain-of-thought template's text.
	"cot": func(s Setup) (any, error) {
		rc := s.Env.Router
		tmpl, err := fileDigest(cotTemplate(s))
		if err != nil {
			return nil, err
		}
		return struct {
			TurnTokens int
			Prompt     string
		}{rc.TurnTokens, tmpl}, nil
	},
	// sft: the sha256 of the SFT-direct checkpoint's files.
	"sft": func(s Setup) (any, error) { return CheckpointDigest(s.SFTCheckpoint) },
	// decompose: the version of the decomposition's prompts and parsing
	// (decompose.go), so that changing them starts those results afresh.
	"decompose": func(s Setup) (any, error) { return decomposeVersion, nil },
	// seed: the seed of the random router's draws.
	"seed": func(s Setup) (any, error) { return s.Seed, nil },
	// largest: the model the largest router asks (and the prompt router's default selector).
	"largest": func(s Setup) (any, error) { return largest(s) },
	// selector: --selector as given.
	"selector": func(s Setup) (any, error) { return s.Selector, nil },
	// cascade: the fitted rule's digest and the threshold.
	"cascade": func(s Setup) (any, error) {
		rule, err := fitCascade(s)
		if err != nil {
			return nil, err
		}
		return struct {
			Rule      string
			Threshold float64
		}{rule.Digest(), s.CascadeThreshold}, nil
	},
	// knn: the logged outcomes' sha256 and k.
	"knn": func(s Setup) (any, error) {
		if s.KNNLog == "" {
			return struct{ Log string }{}, nil // newKNN reports the missing log
		}
		d, err := fileDigest(s.KNNLog)
		return struct {
			Log string
			K   int
		}{d, s.KNNK}, err
	},
}

// identityOf computes the identity of router name's results under s; memo
// keeps parts already computed in this run (the checkpoint's digest reads
// every weight).
func identityOf(name string, s Setup, memo map[string]json.RawMessage) (identity, error) {
	spec, ok := Routers[name]
	if !ok {
		return identity{}, fmt.Errorf("eval: unknown router %q (known: %s)", name, strings.Join(RouterNames(), ", "))
	}
	return makeIdentity(name, spec.Inputs, s, memo, nil)
}

// modelIdentity is the identity of a reference results file
// (reference.go): pool model m answering every question directly, keyed
// by the pool (the "pool" part) and the model's name.
func modelIdentity(m string, s Setup, memo map[string]json.RawMessage) (identity, error) {
	return makeIdentity(modelRouter(m), []string{"pool"}, s, memo, map[string]any{"model": m})
}

// makeIdentity digests the parts of inputParts named by parts, and the
// extra inputs, as the identity of results named name.
func makeIdentity(name string, parts []string, s Setup, memo map[string]json.RawMessage, extra map[string]any) (identity, error) {
	id := identity{Router: name, Inputs: map[string]json.RawMessage{}}
	for _, part := range parts {
		if b, ok := memo[part]; ok {
			id.Inputs[part] = b
			continue
		}
		f, ok := inputParts[part]
		if !ok {
			panic(fmt.Sprintf("eval: router %q lists unknown input %q", name, part)) // a registry bug
		}
		v, err := f(s)
		if err != nil {
			return identity{}, err
		}
		b, err := json.Marshal(v)
		if err != nil {
			return identity{}, fmt.Errorf("eval: input %q of router %s: %w", part, name, err)
		}
		memo[part], id.Inputs[part] = b, b
	}
	for k, v := range extra {
		b, err := json.Marshal(v)
		if err != nil {
			return identity{}, fmt.Errorf("eval: input %q of %s: %w", k, name, err)
		}
		id.Inputs[k] = b
	}
	b, err := json.Marshal(struct {
		Router string
		Inputs map[string]json.RawMessage
	}{id.Router, id.Inputs})
	if err != nil {
		return identity{}, fmt.Errorf("eval: identity of router %s: %w", name, err)
	}
	sum := sha256.Sum256(b)
	id.ID = hex.EncodeToString(sum[:])
	return id, nil
}

// differing names the inputs whose values differ between two identities.
func differing(a, b identity) []string {
	var out []string
	for k, v := range a.Inputs {
		if w, ok := b.Inputs[k]; !ok || !sameJSON(v, w) {
			out = append(out, k)
		}
	}
	for k := range b.Inputs {
		if _, ok := a.Inputs[k]; !ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

func sameJSON(a, b json.RawMessage) bool {
	var x, y bytes.Buffer
	return json.Compact(&x, a) == nil && json.Compact(&y, b) == nil && bytes.Equal(x.Bytes(), y.Bytes())
}

// claimResults makes path (results-<router>.jsonl) hold the answers of id
// only: a file of another identity, or one without any (written before
// results were keyed), is moved aside, and a file moved aside earlier under
// id is taken back.
func claimResults(path string, id identity, log *slog.Logger) error {
	idPath := strings.TrimSuffix(path, ".jsonl") + ".id.json"
	aside := func(suffix string) (string, string) {
		base := strings.TrimSuffix(path, ".jsonl") + "." + suffix
		return base + ".jsonl", base + ".id.json"
	}
	var old identity
	haveID := false
	if b, err := os.ReadFile(idPath); err == nil {
		if json.Unmarshal(b, &old) == nil && old.ID != "" {
			haveID = true
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("eval: %w", err)
	}
	if haveID && old.ID == id.ID {
		return nil // the same evaluation: resume it
	}
	_, err := os.Stat(path)
	haveResults := err == nil
	if haveResults || haveID {
		suffix, why := "unkeyed", "written before results were keyed by what they evaluate"
		if haveID {
			suffix = old.ID[:min(12, len(old.ID))]
			why = "its inputs differ"
			if d := differing(old, id); len(d) > 0 {
				why = "its " + strings.Join(d, ", ") + " differ"
			}
		}
		resAside, idAside := aside(suffix)
		for _, mv := range [][2]string{{path, resAside}, {idPath, idAside}} {
			if _, err := os.Stat(mv[0]); err != nil {
				continue
			}
			if _, err := os.Stat(mv[1]); err == nil {
				return fmt.Errorf("eval: %s holds the results of another evaluation (%s), and %s, where they would be moved, exists; move one of them away", path, why, mv[1])
			}
			if err := os.Rename(mv[0], mv[1]); err != nil {
				return fmt.Errorf("eval: %w", err)
			}
		}
		log.Warn("results of another evaluation moved aside; starting afresh", "router", id.Router, "file", path, "why", why, "moved_to", resAside)
	}
	resAside, idAside := aside(id.ID[:12])
	if b, err := os.ReadFile(idAside); err == nil {
		var earlier identity
		if json.Unmarshal(b, &earlier) == nil && earlier.ID == id.ID {
			if err := os.Rename(resAside, path); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("eval: %w", err)
			}
			if err := os.Rename(idAside, idPath); err != nil {
				return fmt.Errorf("eval: %w", err)
			}
			log.Info("taking back the results of an earlier evaluation of the same inputs", "router", id.Router, "file", resAside)
			return nil
		}
	}
	return atomicfile.Write(idPath, func(w io.Writer) error {
		e := json.NewEncoder(w)
		e.SetIndent("", "  ")
		return e.Encode(id)
	})
}

// checkpointFile reports whether a file of a checkpoint folder decides the
// policy's answers: the model config, the weights (single or sharded, with
// their index), the generation config and the tokenizer files. Optimizer and
// trainer state do not.
func checkpointFile(name string) bool {
	switch name {
	case "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json",
		"merges.txt", "special_tokens_map.json":
		return true
	}
	return strings.HasPrefix(name, "model") && (strings.HasSuffix(name, ".safetensors") || name == "model.safetensors.index.json")
}

// CheckpointDigest is "sha256:<hex>" over the names, sizes and contents of
// the files of checkpoint folder dir that decide the policy's answers (see
// checkpointFile). It reads the contents, so a path that later names other
// weights (checkpoints/last) gets another digest.
func CheckpointDigest(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("eval: checkpoint: %w", err)
	}
	h := sha256.New()
	weights := false
	for _, e := range entries { // ReadDir sorts by name
		if !checkpointFile(e.Name()) {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return "", fmt.Errorf("eval: checkpoint: %w", err)
		}
		st, err := f.Stat()
		if err == nil && !st.Mode().IsRegular() {
			err = fmt.Errorf("%s is not a regular file", f.Name())
		}
		if err == nil {
			var size [8]byte
			binary.LittleEndian.PutUint64(size[:], uint64(st.Size()))
			h.Write([]byte(e.Name() + "\x00"))
			h.Write(size[:])
			_, err = io.Copy(h, f)
		}
		f.Close()
		if err != nil {
			return "", fmt.Errorf("eval: checkpoint: %w", err)
		}
		weights = weights || strings.HasSuffix(e.Name(), ".safetensors")
	}
	if !weights {
		return "", fmt.Errorf("eval: checkpoint %s: no model*.safetensors weights", dir)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// fileDigest is "sha256:<hex>" of one file's contents.
func fileDigest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("eval: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("eval: %s: %w", path, err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}
