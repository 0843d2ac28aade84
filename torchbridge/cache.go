package torchbridge

/*
#include <stdlib.h>
#include "recal.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

// Cache is a KV cache over a fixed number of rows (sequences) of one policy.
// Appending tokens to a row (a prompt, a sampled token, an <information>
// block) never recomputes what the row already holds.
type Cache struct {
	p        *Policy
	h        *C.rc_cache
	rows     int
	capacity int
	vocab    int
}

// NewCache creates a cache for rows sequences of at most capacity tokens.
func (p *Policy) NewCache(rows, capacity int) (*Cache, error) {
	c := &Cache{p: p, rows: rows, capacity: capacity, vocab: int(p.cfg.VocabSize)}
	err := p.call(context.Background(), func(h *C.rc_policy) error {
		var msg *C.char
		if err := status(C.rc_cache_new(h, C.int64_t(rows), C.int64_t(capacity), &c.h, &msg), msg); err != nil {
			return err
		}
		p.caches[c] = struct{}{}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Rows is the number of sequences; Capacity the tokens each can hold.
func (c *Cache) Rows() int     { return c.rows }
func (c *Cache) Capacity() int { return c.capacity }

// Vocab is the policy's vocabulary size: every sampled id is below it.
func (c *Cache) Vocab() int { return c.vocab }

// free runs on the torch thread.
func (c *Cache) free() {
	if c.h != nil {
		C.rc_cache_free(c.h)
		c.h = nil
	}
}

// Close frees the cache. Safe to call twice, and after the policy's Close.
func (c *Cache) Close() error {
	return do(context.Background(), func() error {
		c.free()
		if c.p.caches != nil {
			delete(c.p.caches, c)
		}
		return nil
	})
}

func (c *Cache) call(ctx context.Context, fn func(h *C.rc_cache) error) error {
	return do(ctx, func() error {
		if c.h == nil || c.p.h == nil {
			return ErrClosed
		}
		return fn(c.h)
	})
}

// Reset empties the given rows (all rows when none are given).
func (c *Cache) Reset(ctx context.Context, rows ...int) error {
	r := int64s(rows)
	return c.call(ctx, func(h *C.rc_cache) error {
		var msg *C.char
		if len(r) == 0 {
			return status(C.rc_cache_reset(h, 0, nil, &msg), msg)
		}
		return status(C.rc_cache_reset(h, C.int64_t(len(r)), ptrI64(r), &msg), msg)
	})
}

// Lengths returns how many tokens each row holds.
func (c *Cache) Lengths(ctx context.Context) ([]int, error) {
	out := make([]int64, c.rows)
	err := c.call(ctx, func(h *C.rc_cache) error {
		var msg *C.char
		return status(C.rc_cache_lengths(h, 0, nil, ptrI64(out), &msg), msg)
	})
	res := make([]int, len(out))
	for i, v := range out {
		res[i] = int(v)
	}
	return res, err
}

// Sampling configures next-token selection. Temperature 0 is greedy.
type Sampling struct {
	Temperature float64
	TopP        float64 // 1 (or 0) = off
	TopK        int     // 0 = off
}

// Step is one Extend request: tokens to append to each row.
type Step struct {
	Rows       []int
	Tokens     [][]int32 // Tokens[i] (non-empty) is appended to row Rows[i]
	Sampling   Sampling
	Seed       uint64 // seeds sampling: a row's draw depends on (Seed, RowBase + row, its length) only
	RowBase    int    // added to each row's index in the draw: a data-parallel rank's first global row, so a row draws alike whatever the world size
	WantLogp   bool   // compute Result.Logp (costs a pass over [len(Rows), vocab]); else it is zeros
	WantLogits bool   // also return the [len(Rows), vocab] logits
	// Ban, when not nil, holds for each row (Ban[i] for Rows[i]) tokens
	// that must not be chosen, greedy or sampled; Logp stays the
	// log-probability under the distribution without the ban.
	Ban [][]int32
	// Workers > 1 lets a call with WantLogp on the CPU, made while
	// libtorch runs one thread (SetThreads(1)), decode its rows in up to
	// Workers shares at once (at most one per core): the torch thread takes the first, helper
	// threads (one libtorch thread each) the others. With log-probs asked
	// for, a row's result does not depend on the rows sharing its call
	// (row-invariant kernels, see cgo/recal_rows.cc), so the split changes no
	// bit of any result, only the wall time. Otherwise, and for one row,
	// the call runs whole on the torch thread. A share that fails may
	// leave the other shares' rows extended: the call's error is then the
	// cache's end (the rollout scheduler stops on it).
	Workers int
}

// Result holds the token sampled after each row's last new token, its
// log-probability under the untempered distribution (when asked for), and
// optionally the logits.
type Result struct {
	Next   []int32
	Logp   []float32
	Logits [][]float32
	// Workers is the number of threads that decoded the call's rows at
	// once (1 unless Step.Workers split it).
	Workers int
}

// Extend appends tokens to rows and samples each row's next token.
func (c *Cache) Extend(ctx context.Context, s Step) (Result, error) {
	n := len(s.Rows)
	if n == 0 || len(s.Tokens) != n {
		return Result{}, fmt.Errorf("torchbridge: extend: %d rows with %d token lists", n, len(s.Tokens))
	}
	seen := make([]bool, c.rows) // every decode step passes here: a slice, not a map
	for i, t := range s.Tokens {
		r := s.Rows[i]
		switch {
		case r < 0 || r >= c.rows:
			return Result{}, fmt.Errorf("torchbridge: extend: row %d outside the cache's %d rows", r, c.rows)
		case seen[r]:
			// Checked here, not only in C++: the shares of a split call
			// would each see one of the two and write the row at once.
			return Result{}, fmt.Errorf("torchbridge: extend: row %d given twice", r)
		case len(t) == 0:
			return Result{}, fmt.Errorf("torchbridge: extend: row %d: no tokens", r)
		}
		seen[r] = true
	}
	if s.Ban != nil {
		if len(s.Ban) != n {
			return Result{}, fmt.Errorf("torchbridge: extend: %d rows with %d ban lists", n, len(s.Ban))
		}
		for i, b := range s.Ban {
			for _, t := range b {
				if t < 0 || int(t) >= c.vocab {
					return Result{}, fmt.Errorf("torchbridge: extend: row %d: banned token %d outside the vocabulary (%d)", s.Rows[i], t, c.vocab)
				}
			}
		}
	}
	res := Result{Next: make([]int32, n), Logp: make([]float32, n), Workers: 1}
	if s.WantLogits {
		res.Logits = make([][]float32, n)
	}
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	err := c.call(ctx, func(h *C.rc_cache) error {
		shares := [][]int{all}
		if s.WantLogp && s.Workers > 1 && n > 1 && c.p.opt.Device == "cpu" {
			var one C.int32_t
			var msg *C.char
			if err := status(C.rc_get_threads(&one, &msg), msg); err != nil {
				return err
			}
			if one == 1 {
				shares = split(all, min(s.Workers, n, runtime.NumCPU()))
			}
		}
		res.Workers = len(shares)
		if len(shares) == 1 {
			return c.extendRows(h, s, all, &res)
		}
		parallelCalls.Add(1)
		startHelpers(len(shares) - 1)
		// The torch thread is held until every share is done, so nothing
		// (Close included) can come between.
		errs := make([]error, len(shares))
		var wg sync.WaitGroup
		for k := 1; k < len(shares); k++ {
			wg.Add(1)
			helper(k - 1) <- func(setup error) {
				defer wg.Done()
				if errs[k] = setup; setup == nil {
					errs[k] = c.extendRows(h, s, shares[k], &res)
				}
			}
		}
		errs[0] = c.extendRows(h, s, shares[0], &res)
		wg.Wait()
		return errors.Join(errs...)
	})
	if err != nil {
		return Result{}, err
	}
	return res, nil
}

// split deals idx into k contiguous shares of nearly equal size.
func split(idx []int, k int) [][]int {
	out := make([][]int, k)
	for j := range out {
		out[j] = idx[j*len(idx)/k : (j+1)*len(idx)/k]
	}
	return out
}

// extendRows runs the rows idx of s (indices into s.Rows) in one C call,
// on the calling OS thread, and writes their results into res.
func (c *Cache) extendRows(h *C.rc_cache, s Step, idx []int, res *Result) error {
	n := len(idx)
	width := 0
	for _, i := range idx {
		width = max(width, len(s.Tokens[i]))
	}
	tok := make([]int32, n*width)
	counts := make([]int64, n)
	rows := make([]int64, n)
	for k, i := range idx {
		copy(tok[k*width:], s.Tokens[i])
		counts[k] = int64(len(s.Tokens[i]))
		rows[k] = int64(s.Rows[i])
	}
	next := make([]int32, n)
	logp := make([]float32, n)
	var logits []float32
	if s.WantLogits {
		logits = make([]float32, n*c.vocab)
	}
	so := C.rc_sample_opts{temperature: C.double(s.Sampling.Temperature), top_p: C.double(s.Sampling.TopP), top_k: C.int64_t(s.Sampling.TopK),
		row_base: C.int64_t(s.RowBase), want_logp: cBool(s.WantLogp)}
	if s.Ban != nil {
		var ban []int32
		for _, i := range idx {
			ban = append(ban, s.Ban[i]...)
		}
		if len(ban) > 0 {
			// so is Go memory, so it must not hold Go pointers (cgo's
			// rules): the lists are copied to C memory for the call.
			cb := (*C.int32_t)(C.malloc(C.size_t(4 * len(ban))))
			cc := (*C.int64_t)(C.malloc(C.size_t(8 * n)))
			defer C.free(unsafe.Pointer(cb))
			defer C.free(unsafe.Pointer(cc))
			copy(unsafe.Slice((*int32)(unsafe.Pointer(cb)), len(ban)), ban)
			bc := unsafe.Slice((*int64)(unsafe.Pointer(cc)), n)
			for k, i := range idx {
				bc[k] = int64(len(s.Ban[i]))
			}
			so.ban, so.ban_counts = cb, cc
		}
	}
	var msg *C.char
	rc := C.rc_cache_extend(h, C.int64_t(n), ptrI64(rows), C.int64_t(width), ptrI32(tok), ptrI64(counts), &so,
		C.uint64_t(s.Seed), ptrI32(next), ptrF32(logp), ptrF32(logits), &msg)
	if err := status(rc, msg); err != nil {
		return err
	}
	for k, i := range idx {
		res.Next[i], res.Logp[i] = next[k], logp[k]
		if logits != nil {
			res.Logits[i] = logits[k*c.vocab : (k+1)*c.vocab]
		}
	}
	return nil
}
