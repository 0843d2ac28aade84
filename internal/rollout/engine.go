package rollout

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/internal/generate"
	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/internal/tokenizer"
	"github.com/recal-project/recal/torchbridge"
)

// Engine is a loaded policy with its tokenizer and stop tokens.
type Engine struct {
	Policy *torchbridge.Policy
	Tok    *tokenizer.Tokenizer
	EOS    []int32
	CtxLen int // max_position_embeddings
	Dir    string
}

// SetThreads sets libtorch's CPU threads; n ≤ 0 means all cores.
func SetThreads(n int) error {
	if n <= 0 {
		n = runtime.NumCPU()
	}
	return torchbridge.SetThreads(n)
}

// DecodeThreads sets libtorch's CPU threads to n (policy.decode_threads)
// for a stretch of decoding and returns the function that restores the
// count from before; n ≤ 0 changes nothing. All torch work runs on one
// thread, so the count holds for exactly the calls in between.
func DecodeThreads(n int) (restore func() error, err error) {
	if n <= 0 {
		return func() error { return nil }, nil
	}
	before, err := torchbridge.Threads()
	if err != nil {
		return nil, err
	}
	if err := torchbridge.SetThreads(n); err != nil {
		return nil, err
	}
	return func() error { return torchbridge.SetThreads(before) }, nil
}

// OpenEngine loads a checkpoint folder and the tokenizer inside it.
func OpenEngine(dir string, opt torchbridge.Options) (*Engine, error) {
	tok, err := tokenizer.Load(dir)
	if err != nil {
		return nil, err
	}
	p, err := torchbridge.LoadPolicy(dir, opt)
	if err != nil {
		return nil, err
	}
	cfg := p.Config()
	if int64(tok.VocabSize()) > cfg.VocabSize {
		p.Close()
		return nil, fmt.Errorf("%s: the tokenizer has %d ids but the model's vocab_size is %d", dir, tok.VocabSize(), cfg.VocabSize)
	}
	ids, err := hfmodel.EOS(dir, cfg)
	if err != nil {
		p.Close()
		return nil, err
	}
	e := &Engine{Policy: p, Tok: tok, CtxLen: int(cfg.MaxPositionEmbeddings), Dir: dir}
	for _, id := range ids {
		e.EOS = append(e.EOS, int32(id))
	}
	if len(e.EOS) == 0 && tok.EOS() >= 0 {
		e.EOS = []int32{int32(tok.EOS())}
	}
	return e, nil
}

// Close frees the policy.
func (e *Engine) Close() error { return e.Policy.Close() }

// Decoder lets generate and router drive a torchbridge KV cache. Logp asks
// for the sampled tokens' log-probabilities (training needs them; greedy
// evaluation does not). RowBase is the global row of cache row 0: a
// data-parallel rank holding rows [RowBase, RowBase+n) of a step's batch
// draws for each row what one process would draw for it. Workers is
// torchbridge.Step.Workers of every call.
type Decoder struct {
	C       *torchbridge.Cache
	Logp    bool
	RowBase int
	Workers int
}

// Extend implements generate.Decoder.
func (d Decoder) Extend(ctx context.Context, rows []int, tokens [][]int32, s generate.Sampling, seed uint64) ([]int32, []float32, error) {
	r, err := d.C.Extend(ctx, torchbridge.Step{Rows: rows, Tokens: tokens, Seed: seed, WantLogp: d.Logp, RowBase: d.RowBase, Workers: d.Workers,
		Sampling: torchbridge.Sampling{Temperature: s.Temperature, TopP: s.TopP, TopK: s.TopK}})
	return r.Next, r.Logp, err
}

// ExtendBanned implements router.BanDecoder.
func (d Decoder) ExtendBanned(ctx context.Context, rows []int, tokens [][]int32, s generate.Sampling, seed uint64, ban [][]int32) ([]int32, []float32, error) {
	r, err := d.C.Extend(ctx, torchbridge.Step{Rows: rows, Tokens: tokens, Seed: seed, WantLogp: d.Logp, RowBase: d.RowBase, Workers: d.Workers, Ban: ban,
		Sampling: torchbridge.Sampling{Temperature: s.Temperature, TopP: s.TopP, TopK: s.TopK}})
	return r.Next, r.Logp, err
}

// Vocab implements router.VocabDecoder.
func (d Decoder) Vocab() int { return d.C.Vocab() }

// ToInt32 converts token ids.
func ToInt32(ids []int) []int32 {
	out := make([]int32, len(ids))
	for i, v := range ids {
		out[i] = int32(v)
	}
	return out
}

// Open opens checkpoint ck (on rc.Policy's device and dtype) in rc's
// routing environment (NewEnv, whose pool draws wrong answers from bank).
// close closes the environment's pool and the policy.
func Open(rc config.Rollout, ck string, bank map[string][]string, log *slog.Logger) (env *Env, close func(), err error) {
	eng, err := OpenEngine(ck, torchbridge.Options{Device: rc.Policy.Device, DType: rc.Policy.DType, EagerDecode: rc.Policy.EagerDecode})
	if err != nil {
		return nil, nil, fmt.Errorf("checkpoint %s is not a policy: %w", ck, err)
	}
	if env, err = NewEnv(rc, eng, bank, log); err != nil {
		eng.Close()
		return nil, nil, err
	}
	return env, func() { env.Close(); eng.Close() }, nil
}
