package main

import (
	"context"
	"fmt"
	"runtime"

	"github.com/recal-project/recal/generate"
	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/tokenizer"
	"github.com/recal-project/recal/torchbridge"
)

// engine is a loaded policy with its tokenizer and stop tokens.
type engine struct {
	policy *torchbridge.Policy
	tok    *tokenizer.Tokenizer
	eos    []int32
	ctxLen int
}

func setThreads(n int) error {
	if n <= 0 {
		n = runtime.NumCPU()
	}
	return torchbridge.SetThreads(n)
}

// openEngine loads a checkpoint folder and the tokenizer inside it.
func openEngine(dir string, opt torchbridge.Options) (*engine, error) {
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
	e := &engine{policy: p, tok: tok, ctxLen: int(cfg.MaxPositionEmbeddings)}
	for _, id := range ids {
		e.eos = append(e.eos, int32(id))
	}
	if len(e.eos) == 0 && tok.EOS() >= 0 {
		e.eos = []int32{int32(tok.EOS())}
	}
	return e, nil
}

func (e *engine) Close() error { return e.policy.Close() }

// cacheDecoder lets generate drive a torchbridge KV cache.
type cacheDecoder struct{ c *torchbridge.Cache }

func (d cacheDecoder) Extend(ctx context.Context, rows []int, tokens [][]int32, s generate.Sampling, seed uint64) ([]int32, []float32, error) {
	r, err := d.c.Extend(ctx, torchbridge.Step{Rows: rows, Tokens: tokens, Seed: seed,
		Sampling: torchbridge.Sampling{Temperature: s.Temperature, TopP: s.TopP, TopK: s.TopK}})
	return r.Next, r.Logp, err
}

func toInt32(ids []int) []int32 {
	out := make([]int32, len(ids))
	for i, v := range ids {
		out[i] = int32(v)
	}
	return out
}
