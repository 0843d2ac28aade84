// Package torchbridge runs the routing policy, a Qwen2-architecture decoder,
// through libtorch. It is the only package of recal that uses cgo; the C++
// lives in cgo/recal_*.cc behind the C ABI of cgo/recal.h and is built into
// build/librecal.a by the Makefile (`make build`).
//
// All torch work runs on one goroutine locked to an OS thread, so concurrent
// Go callers never interleave libtorch's thread-local state (grad mode,
// guards); only a row-parallel Cache.Extend (Step.Workers) has helper
// threads decode shares of its rows meanwhile. Handles are freed by Close,
// never by finalizers.
package torchbridge

/*
#cgo CFLAGS: -I${SRCDIR}/../cgo
#cgo LDFLAGS: -L${SRCDIR}/../build -lrecal -ltorch -ltorch_cpu -lc10 -lstdc++ -lm
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
	"sync/atomic"
	"unsafe"
)

// ErrClosed is returned by calls on a closed handle.
var ErrClosed = errors.New("torchbridge: use of a closed handle")

// status converts a C status and message into a Go error, freeing the message.
func status(rc C.int, msg *C.char) error {
	if rc == 0 {
		return nil
	}
	s := "unknown error"
	if msg != nil {
		s = C.GoString(msg)
		C.free(unsafe.Pointer(msg))
	}
	return fmt.Errorf("torchbridge: %s", s)
}

// The torch thread: one goroutine, locked to its OS thread, runs every call.
var (
	workOnce sync.Once
	work     chan func()
)

func startWorker() {
	work = make(chan func())
	go func() {
		runtime.LockOSThread()
		for fn := range work {
			fn()
		}
	}()
}

// Helper threads: Cache.Extend hands the shares of a row-parallel call
// (Step.Workers) after the first to them, while the torch thread, which
// runs the first share, waits for them. Each is a goroutine locked to its
// OS thread and set to one libtorch thread, started before any share of
// the call runs; they only ever run such shares, each while the torch
// thread is held.
var (
	helpersMu sync.Mutex
	helpers   []chan func(setup error)
	// parallelCalls counts the Extend calls split among threads.
	parallelCalls atomic.Int64
)

// ParallelCalls reports how many Cache.Extend calls of this process ran
// their rows on several threads at once (Step.Workers).
func ParallelCalls() int64 { return parallelCalls.Load() }

// startHelpers makes sure helper threads 0..n-1 exist and are set up. It
// runs on the torch thread, while no share runs, so a helper's set-up
// (which writes process-wide thread counts, already 1) overlaps no work.
func startHelpers(n int) {
	helpersMu.Lock()
	defer helpersMu.Unlock()
	for len(helpers) < n {
		ch := make(chan func(error))
		ready := make(chan struct{})
		go func() {
			runtime.LockOSThread()
			var msg *C.char
			setup := status(C.rc_set_threads(1, &msg), msg)
			close(ready)
			for fn := range ch {
				fn(setup)
			}
		}()
		<-ready
		helpers = append(helpers, ch)
	}
}

// helper returns the queue of helper thread i (started by startHelpers).
// A job gets the error of the thread's set-up (nil when it can run).
func helper(i int) chan func(setup error) {
	helpersMu.Lock()
	defer helpersMu.Unlock()
	return helpers[i]
}

// do runs fn on the torch thread and waits for it. A ctx cancelled before fn
// starts returns ctx.Err(); once started, fn runs to the end (a C++ call
// cannot be interrupted).
func do(ctx context.Context, fn func() error) error {
	workOnce.Do(startWorker)
	if ctx == nil {
		ctx = context.Background()
	}
	done := make(chan error, 1)
	job := func() {
		if err := ctx.Err(); err != nil {
			done <- err
			return
		}
		done <- fn()
	}
	select {
	case work <- job:
	case <-ctx.Done():
		return ctx.Err()
	}
	return <-done
}

// SetThreads sets libtorch's intra-op CPU threads (and OpenBLAS's) for
// the work that follows; n ≤ 0 leaves them. It may be called between
// pieces of work: all of it runs on the torch thread.
func SetThreads(n int) error {
	return do(context.Background(), func() error {
		var msg *C.char
		return status(C.rc_set_threads(C.int32_t(n), &msg), msg)
	})
}

// ReleaseMemory hands the pages of the CPU heap's free memory back to the
// system (glibc's malloc_trim). Under UseTrainingMalloc the heap keeps
// what tensors below 32 MiB leave when freed, for reuse; a phase that
// needs much memory of other sizes (a policy loaded for a moment: the KL
// reference under policy.reload_reference) then finds it resident but
// unusable. Releasing it first costs the next reuse a page fault per page.
func ReleaseMemory() error {
	return do(context.Background(), func() error {
		var msg *C.char
		return status(C.rc_release_memory(&msg), msg)
	})
}

// Threads returns libtorch's intra-op CPU threads of the torch thread.
func Threads() (int, error) {
	var n C.int32_t
	err := do(context.Background(), func() error {
		var msg *C.char
		return status(C.rc_get_threads(&n, &msg), msg)
	})
	return int(n), err
}

// CheckKernels checks the row-invariant decoding kernels (cgo/recal_rows.cc,
// the extend path of float32 policies on the CPU): their AVX-512 path (the
// matrix products, where the CPU has it), AVX2 path and portable path
// compute the same bits on values drawn from seed, for every tile shape and
// length tail. vector reports whether this CPU ran a vector path (false:
// only the portable path exists here, nothing to compare).
func CheckKernels(seed uint64) (vector bool, err error) {
	var v C.int32_t
	err = do(context.Background(), func() error {
		var msg *C.char
		return status(C.rc_kernels_check(C.uint64_t(seed), &v, &msg), msg)
	})
	return v != 0, err
}

// CUDAAvailable reports whether the linked libtorch can run on a GPU.
func CUDAAvailable() (bool, error) {
	var ok C.int32_t
	err := do(context.Background(), func() error {
		var msg *C.char
		return status(C.rc_cuda_available(&ok, &msg), msg)
	})
	return ok != 0, err
}

// int64s copies Go ints into a C-compatible slice.
func int64s(v []int) []int64 {
	out := make([]int64, len(v))
	for i, x := range v {
		out[i] = int64(x)
	}
	return out
}

func ptrI64(v []int64) *C.int64_t {
	if len(v) == 0 {
		return nil
	}
	return (*C.int64_t)(unsafe.Pointer(&v[0]))
}

func ptrI32(v []int32) *C.int32_t {
	if len(v) == 0 {
		return nil
	}
	return (*C.int32_t)(unsafe.Pointer(&v[0]))
}

func ptrF32(v []float32) *C.float {
	if len(v) == 0 {
		return nil
	}
	return (*C.float)(unsafe.Pointer(&v[0]))
}
