package baselines

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/recal-project/recal/embed"
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

var (
	// ErrNotFitted: no fitted router where one was expected.
	ErrNotFitted = errors.New("baselines: router not fitted")
	// ErrCorrupt: a router folder that cannot be read back as written
	// (missing or unreadable files, digests that do not match, tensors of
	// the wrong shape).
	ErrCorrupt = errors.New("baselines: corrupt router folder")
	// ErrEmbedding: the configured embeddings are not those the router was
	// fitted on.
	ErrEmbedding = errors.New("baselines: embeddings differ from the router's")
)

// Query is a question to route.
type Query struct {
	Text    string
	Dataset string // the question's dataset (GraphRouter's task node)
}

// RoutedModel is a pool model a router chooses among.
type RoutedModel struct {
	Name string `json:"name"`
	// MeanCost is the model's mean cost per question on the matrix (USD).
	MeanCost float64 `json:"mean_cost"`
	// Cost is MeanCost over the highest model's: the unit of cost_lambda.
	Cost float64 `json:"cost"`
	// Description is the pool's description of the model.
	Description string `json:"description"`
}

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

// model is a variant's trained network.
type model interface {
	// weights lists the saved tensors, in a fixed order.
	weights() []*param
	// scores returns, per question, the utility of each model (higher is
	// better, cost penalty included): the router picks the argmax.
	scores(ctx context.Context, in scoreInput) ([][]float64, error)
}

// scoreInput is what a model scores.
type scoreInput struct {
	x        []float64 // n×dim question embeddings, row-major
	n, dim   int
	datasets []string
	embed    func(ctx context.Context, texts []string) ([]float64, error) // n×dim, flat
}

// fitData is what a variant is fitted on.
type fitData struct {
	m      *Matrix
	x      []float64 // question embeddings, len(m.Questions)×dim
	dim    int
	models []RoutedModel
	embed  func(ctx context.Context, texts []string) ([]float64, error)
	// train are the questions trained on; val selects the weights (select.go).
	train []int
	val   *validation
}

// spec is a registered router.
type spec struct {
	// hyper returns the router's table of c, saved in the manifest.
	hyper func(c Config) any
	// fit trains a model on d with the router's table of c.
	fit func(ctx context.Context, d *fitData, c Config, rng *rand.Rand) (model, error)
	// build makes an untrained model with a manifest's shapes (its table,
	// embedding size and models), for Load to fill with the saved weights.
	build func(man *Manifest) (model, error)
	// lambda is the router's cost_lambda in c (its model selection weighs
	// cost with it, as its routing does).
	lambda func(c Config) float64
}

// registry holds the trainable baseline routers of the ReCal paper's
// Table 1, each documented at its type: "mlp" (mlpModel, RouterBench),
// "routellm-mf" (mfModel, RouteLLM), "routerdc" (dcModel, RouterDC) and
// "graphrouter" (graphModel, GraphRouter). Unknown names are an error
// listing these.
var registry = map[string]spec{
	"mlp": {hyper: func(c Config) any { return c.MLP }, fit: fitMLP, build: buildMLP,
		lambda: func(c Config) float64 { return c.MLP.CostLambda }},
	"routellm-mf": {hyper: func(c Config) any { return c.RouteLLMMF }, fit: fitMF, build: buildMF,
		lambda: func(c Config) float64 { return c.RouteLLMMF.CostLambda }},
	"routerdc": {hyper: func(c Config) any { return c.RouterDC }, fit: fitDC, build: buildDC,
		lambda: func(c Config) float64 { return c.RouterDC.CostLambda }},
	"graphrouter": {hyper: func(c Config) any { return c.GraphRouter }, fit: fitGraph, build: buildGraph,
		lambda: func(c Config) float64 { return c.GraphRouter.CostLambda }},
}

// Names lists the registered routers, sorted.
func Names() []string {
	out := make([]string, 0, len(registry))
	for k := range registry {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func lookup(name string) (spec, error) {
	s, ok := registry[name]
	if !ok {
		return spec{}, fmt.Errorf("baselines: unknown router %q (known: %s)", name, strings.Join(Names(), ", "))
	}
	return s, nil
}

// Router is a fitted baseline router: it embeds a question, scores each
// pool model and picks the best.
type Router struct {
	man Manifest
	emb embed.Embedder
	mdl model
}

// Name is the router's registered name.
func (r *Router) Name() string { return r.man.Router }

// Models lists the models the router chooses among, in pool order.
func (r *Router) Models() []string {
	out := make([]string, len(r.man.Models))
	for i, m := range r.man.Models {
		out[i] = m.Name
	}
	return out
}

// Manifest returns the router's manifest.
func (r *Router) Manifest() Manifest { return r.man }

// Scores returns, per query, each model's utility (see model.scores).
func (r *Router) Scores(ctx context.Context, qs []Query) ([][]float64, error) {
	if len(qs) == 0 {
		return nil, nil
	}
	texts := make([]string, len(qs))
	in := scoreInput{n: len(qs), dim: r.man.Dim, datasets: make([]string, len(qs)), embed: r.embedFlat}
	for i, q := range qs {
		texts[i], in.datasets[i] = q.Text, q.Dataset
	}
	x, err := r.embedFlat(ctx, texts)
	if err != nil {
		return nil, err
	}
	in.x = x
	return r.mdl.scores(ctx, in)
}

// Route returns the chosen model per query: the highest utility, the first
// in pool order on a tie.
func (r *Router) Route(ctx context.Context, qs []Query) ([]string, error) {
	sc, err := r.Scores(ctx, qs)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(qs))
	for i, s := range sc {
		best := 0
		for j := range s {
			if s[j] > s[best] {
				best = j
			}
		}
		out[i] = r.man.Models[best].Name
	}
	return out, nil
}

// embedFlat embeds texts into one row-major float64 matrix of width Dim.
func (r *Router) embedFlat(ctx context.Context, texts []string) ([]float64, error) {
	return embedFlat(ctx, r.emb, texts, r.man.Dim)
}

func embedFlat(ctx context.Context, e embed.Embedder, texts []string, dim int) ([]float64, error) {
	vs, err := e.Embed(ctx, texts)
	if err != nil {
		return nil, err
	}
	out := make([]float64, 0, len(texts)*dim)
	for i, v := range vs {
		if dim > 0 && len(v) != dim {
			return nil, fmt.Errorf("%w: text %d has a %d-dimensional vector, the router's are %d-dimensional", ErrEmbedding, i, len(v), dim)
		}
		for _, x := range v {
			out = append(out, float64(x))
		}
	}
	return out, nil
}

// Fit trains router name on the outcome matrix m with questions embedded by
// emb (fitted on the matrix's questions first when it keeps statistics, as
// the local IDF) and the router's table of cfg, deterministically for a
// seed: fitting twice gives the same weights, and Save the same bytes. The
// weights are rounded to float32, as saved, so the returned router routes
// as a loaded one.
func Fit(ctx context.Context, name string, cfg Config, m *Matrix, emb embed.Embedder, seed int64) (*Router, error) {
	sp, err := lookup(name)
	if err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if m == nil || len(m.Questions) == 0 || len(m.Models) < 2 {
		return nil, fmt.Errorf("baselines: fit %s: the matrix needs questions and at least two models", name)
	}
	texts := make([]string, len(m.Questions))
	for i, q := range m.Questions {
		texts[i] = q.Text
	}
	if emb, err = embed.Fit(emb, texts); err != nil {
		return nil, fmt.Errorf("baselines: fit %s: %w", name, err)
	}
	vs, err := emb.Embed(ctx, texts)
	if err != nil {
		return nil, fmt.Errorf("baselines: fit %s: embed the questions: %w", name, err)
	}
	dim := len(vs[0])
	x, err := embedFlat(ctx, emb, texts, dim) // served by the embedder's memory cache
	if err != nil {
		return nil, err
	}
	d := &fitData{m: m, x: x, dim: dim, models: routedModels(m),
		embed: func(ctx context.Context, t []string) ([]float64, error) { return embedFlat(ctx, emb, t, dim) }}
	h := fnv.New64a()
	h.Write([]byte(name))
	rng := rand.New(rand.NewPCG(uint64(seed), h.Sum64()))
	d.train, d.val = split(len(m.Questions), cfg.ValShare, rng)
	d.val.weigh(sp.lambda(cfg), costs(d.models))
	mdl, err := sp.fit(ctx, d, cfg, rng)
	if err != nil {
		return nil, fmt.Errorf("baselines: fit %s: %w", name, err)
	}
	d.val.restore(mdl)
	for _, p := range mdl.weights() {
		for i, w := range p.w {
			p.w[i] = float64(float32(w))
		}
	}
	hyper, err := json.Marshal(sp.hyper(cfg))
	if err != nil {
		return nil, fmt.Errorf("baselines: fit %s: %w", name, err)
	}
	ref := MatrixRef{Digest: m.Digest, Pool: m.Pool.ID, Questions: len(m.Questions), Datasets: map[string]int{}}
	for _, q := range m.Questions {
		ref.Datasets[q.Dataset]++
	}
	man := Manifest{Router: name, Format: formatVersion, Embedding: emb.Info(), Dim: dim, Models: d.models,
		Hyper: hyper, Seed: seed, Matrix: ref, ValShare: cfg.ValShare, Validation: d.val.ref}
	return &Router{man: man, emb: emb, mdl: mdl}, nil
}

// routedModels are the matrix's models with their mean and relative costs.
func routedModels(m *Matrix) []RoutedModel {
	out := make([]RoutedModel, len(m.Models))
	top := 0.0
	for j, name := range m.Models {
		var s float64
		for i := range m.Questions {
			s += m.Cost[i][j]
		}
		out[j] = RoutedModel{Name: name, MeanCost: s / float64(len(m.Questions))}
		if j < len(m.Pool.Models) {
			out[j].Description = m.Pool.Models[j].Description
		}
		top = max(top, out[j].MeanCost)
	}
	for j := range out {
		if top > 0 {
			out[j].Cost = out[j].MeanCost / top
		}
	}
	return out
}

// costs returns the models' relative costs.
func costs(ms []RoutedModel) []float64 {
	out := make([]float64, len(ms))
	for i, m := range ms {
		out[i] = m.Cost
	}
	return out
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
		if err := hfmodel.WriteAtomic(spath, func(w io.Writer) error { _, err := w.Write(st); return err }); err != nil {
			return fmt.Errorf("baselines: save: %w", err)
		}
		if man.EmbeddingState, err = fileSHA(spath); err != nil {
			return err
		}
	}
	err = hfmodel.WriteAtomic(filepath.Join(tmp, ManifestFile), func(w io.Writer) error {
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

// batchRows copies rows idx of the n×dim matrix x.
func batchRows(x []float64, dim int, idx []int) []float64 {
	out := make([]float64, len(idx)*dim)
	for i, k := range idx {
		copy(out[i*dim:(i+1)*dim], x[k*dim:(k+1)*dim])
	}
	return out
}

// checkCtx returns ctx's error every 16 steps (fits check between steps).
func checkCtx(ctx context.Context, step int) error {
	if step%16 == 0 {
		return ctx.Err()
	}
	return nil
}

// permOf returns the indices idx in a random order.
func permOf(idx []int, rng *rand.Rand) []int {
	out := make([]int, len(idx))
	for i, k := range rng.Perm(len(idx)) {
		out[i] = idx[k]
	}
	return out
}
