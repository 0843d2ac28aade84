package baselines

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"

	"github.com/recal-project/recal/eval/embed"
	"github.com/recal-project/recal/internal/atomicfile"
	"github.com/recal-project/recal/internal/hfmodel"
)

// Files of a fitted router's folder.
const (
	ManifestFile       = "manifest.json"
	WeightsFile        = "weights.safetensors"
	EmbeddingStateFile = "embedding-state.json"
)

// formatVersion is the version of a router folder's layout and manifest.
const formatVersion = 1

// MatrixRef names the outcome matrix a router was fitted on.
type MatrixRef struct {
	Digest    string         `json:"digest"`
	Pool      string         `json:"pool"`
	Questions int            `json:"questions"`
	Datasets  map[string]int `json:"datasets"`
}

// Manifest describes a fitted router's folder. It holds no time stamp: the
// same fit writes the same bytes.
type Manifest struct {
	Router string `json:"router"`
	Format int    `json:"format"`
	// Embedding identifies the question embeddings (with the fitted
	// state's digest); Dim is their length.
	Embedding embed.Info `json:"embedding"`
	Dim       int        `json:"dim"`
	// Models are the pool models routed among, in pool order.
	Models []RoutedModel `json:"models"`
	// Hyper is the router's [baselines.*] table as fitted.
	Hyper json.RawMessage `json:"hyper"`
	Seed  int64           `json:"seed"`
	// ValShare is baselines.val_share; Validation the selection it made.
	ValShare   float64       `json:"val_share"`
	Validation ValidationRef `json:"validation"`
	// Matrix is the outcome matrix fitted on.
	Matrix MatrixRef `json:"matrix"`
	// Weights and EmbeddingState are "sha256:<hex>" of weights.safetensors
	// and embedding-state.json ("" when the embedder keeps no state).
	Weights        string `json:"weights"`
	EmbeddingState string `json:"embedding_state,omitempty"`
}

// Save writes the router into dir (created; an existing folder is replaced
// whole, never merged): weights.safetensors (float32), the embedder's
// fitted state and manifest.json, each written atomically, manifest last.
func (r *Router) Save(dir string) error {
	parent := filepath.Dir(filepath.Clean(dir))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("baselines: save: %w", err)
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".tmp-*")
	if err != nil {
		return fmt.Errorf("baselines: save: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("baselines: save: %w", err)
	}
	man := r.man
	ws := r.mdl.weights()
	specs := make([]hfmodel.TensorSpec, len(ws))
	for i, p := range ws {
		specs[i] = hfmodel.TensorSpec{Name: p.name, DType: "F32", Shape: []int64{int64(p.r), int64(p.c)}}
	}
	wpath := filepath.Join(tmp, WeightsFile)
	err = hfmodel.WriteSafetensors(wpath, specs, map[string]string{"router": man.Router}, func(i int, buf []byte) error {
		for k, w := range ws[i].w {
			binary.LittleEndian.PutUint32(buf[4*k:], math.Float32bits(float32(w)))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("baselines: save: %w", err)
	}
	if man.Weights, err = fileSHA(wpath); err != nil {
		return err
	}
	if st := embed.State(r.emb); st != nil {
		spath := filepath.Join(tmp, EmbeddingStateFile)
		if err := atomicfile.Write(spath, func(w io.Writer) error { _, err := w.Write(st); return err }); err != nil {
			return fmt.Errorf("baselines: save: %w", err)
		}
		if man.EmbeddingState, err = fileSHA(spath); err != nil {
			return err
		}
	}
	err = atomicfile.Write(filepath.Join(tmp, ManifestFile), func(w io.Writer) error {
		e := json.NewEncoder(w)
		e.SetIndent("", "  ")
		return e.Encode(man)
	})
	if err != nil {
		return fmt.Errorf("baselines: save: %w", err)
	}
	old := ""
	if _, err := os.Stat(dir); err == nil {
		old = tmp + ".old"
		if err := os.Rename(dir, old); err != nil {
			return fmt.Errorf("baselines: save: %w", err)
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		if old != "" {
			os.Rename(old, dir)
		}
		return fmt.Errorf("baselines: save: %w", err)
	}
	if old != "" {
		os.RemoveAll(old)
	}
	r.man = man
	return nil
}

// Load reads a router folder written by Save, with emb the configured
// embedder (the router's fitted embedding state, if any, is applied to it).
// A missing folder is an error wrapping ErrNotFitted; a folder that does
// not read back as written wraps ErrCorrupt; embeddings other than those
// fitted on wrap ErrEmbedding.
func Load(dir string, emb embed.Embedder) (*Router, error) {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: no folder %s", ErrNotFitted, dir)
	}
	corrupt := func(format string, args ...any) error {
		return fmt.Errorf("%w %s: %s", ErrCorrupt, dir, fmt.Sprintf(format, args...))
	}
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		return nil, corrupt("%v", err)
	}
	var man Manifest
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&man); err != nil {
		return nil, corrupt("%s: %v", ManifestFile, err)
	}
	sp, err := lookup(man.Router)
	if err != nil {
		return nil, corrupt("%v", err)
	}
	switch {
	case man.Format != formatVersion:
		return nil, corrupt("format %d, this build reads %d; fit it again", man.Format, formatVersion)
	case man.Dim < 1 || len(man.Models) < 2:
		return nil, corrupt("%s: dim %d and %d models", ManifestFile, man.Dim, len(man.Models))
	}
	want, got := man.Embedding, emb.Info()
	want.State, got.State = "", ""
	if got.Dim == 0 { // an openai model of unstated size: checked on the vectors
		got.Dim = want.Dim
	}
	if want != got {
		return nil, fmt.Errorf("%w: router %s in %s was fitted on %+v, [embedding] gives %+v; fit it again or restore the [embedding] table",
			ErrEmbedding, man.Router, dir, want, got)
	}
	if man.EmbeddingState != "" {
		spath := filepath.Join(dir, EmbeddingStateFile)
		st, err := os.ReadFile(spath)
		if err != nil {
			return nil, corrupt("%v", err)
		}
		if d := bytesSHA(st); d != man.EmbeddingState {
			return nil, corrupt("%s has digest %s, the manifest says %s", EmbeddingStateFile, d, man.EmbeddingState)
		}
		if emb, err = embed.WithState(emb, st); err != nil {
			return nil, corrupt("%v", err)
		}
	}
	if emb.Info().State != man.Embedding.State {
		return nil, corrupt("embedding state %q, the manifest says %q", emb.Info().State, man.Embedding.State)
	}
	wpath := filepath.Join(dir, WeightsFile)
	if d, err := fileSHA(wpath); err != nil {
		return nil, corrupt("%v", err)
	} else if d != man.Weights {
		return nil, corrupt("%s has digest %s, the manifest says %s", WeightsFile, d, man.Weights)
	}
	mdl, err := sp.build(&man)
	if err != nil {
		return nil, corrupt("%v", err)
	}
	w, err := hfmodel.OpenWeightsFile(wpath)
	if err != nil {
		return nil, corrupt("%v", err)
	}
	defer w.Close()
	ps := mdl.weights()
	if len(w.Names()) != len(ps) {
		return nil, corrupt("%s holds %d tensors, router %s has %d", WeightsFile, len(w.Names()), man.Router, len(ps))
	}
	for _, p := range ps {
		t, ok := w.Lookup(p.name)
		if !ok {
			return nil, corrupt("%s lacks tensor %q", WeightsFile, p.name)
		}
		if t.DType != "F32" || len(t.Shape) != 2 || t.Shape[0] != int64(p.r) || t.Shape[1] != int64(p.c) {
			return nil, corrupt("tensor %q is %s %v, want F32 [%d %d]", p.name, t.DType, t.Shape, p.r, p.c)
		}
		raw, err := w.Read(t)
		if err != nil {
			return nil, corrupt("%v", err)
		}
		for k := range p.w {
			p.w[k] = float64(math.Float32frombits(binary.LittleEndian.Uint32(raw[4*k:])))
			if math.IsNaN(p.w[k]) || math.IsInf(p.w[k], 0) {
				return nil, corrupt("tensor %q has a non-finite value", p.name)
			}
		}
	}
	return &Router{man: man, emb: emb, mdl: mdl}, nil
}

// Digest is "sha256:<hex>" over the names, sizes and contents of a router
// folder's files (manifest, weights, embedding state): what eval keys a
// baseline router's results by. A missing folder wraps ErrNotFitted.
func Digest(dir string) (string, error) {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("%w: no folder %s", ErrNotFitted, dir)
	}
	h := sha256.New()
	for _, name := range []string{ManifestFile, WeightsFile, EmbeddingStateFile} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if errors.Is(err, os.ErrNotExist) && name == EmbeddingStateFile {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("%w %s: %v", ErrCorrupt, dir, err)
		}
		var size [8]byte
		binary.LittleEndian.PutUint64(size[:], uint64(len(b)))
		h.Write([]byte(name + "\x00"))
		h.Write(size[:])
		h.Write(b)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

func fileSHA(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("baselines: %w", err)
	}
	return bytesSHA(b), nil
}

func bytesSHA(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// decodeHyper reads a manifest's table strictly.
func decodeHyper(man *Manifest, into any) error {
	dec := json.NewDecoder(bytes.NewReader(man.Hyper))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		return fmt.Errorf("hyper-parameters: %w", err)
	}
	return nil
}
