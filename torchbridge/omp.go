package torchbridge

import (
	"os"
	"syscall"
)

// UsePassiveOpenMP re-executes the running program so that the threads of
// the CPU math libraries do not spin while they wait for work, unless the
// variables below are set already (a variable the user set is kept). The
// libraries read them only when they are loaded, so they cannot be changed
// from inside the process. Call it first thing in main (and TestMain). It
// returns normally when nothing is missing or the re-exec fails.
//
// OMP_WAIT_POLICY=PASSIVE: with the default, the idle threads of libtorch's
// intra-op pool (libgomp) spin, and on small machines they steal the cores
// from the Go runtime and from BLAS: measured on a 2-core VM, prefill ran
// 3.5× and batch-1 decode 2.6× slower.
//
// OPENBLAS_THREAD_TIMEOUT=4: Debian's libopenblas0-pthread keeps a pool of
// one thread per core; after every matrix product its threads wait for the
// next one in a sched_yield loop for about 0.1 s (2^28 cycles). The kernel's
// share of CPU time was about half the user time. With a timeout of 2^4
// cycles the idle threads sleep at once and are woken for the next product.
// Measured on a 2-core VM, 8 GRPO steps of the offline default, back to back
// (bench/cpu.sh train): user 23.2 s, sys 10.8 s, 1.84 s/step before; user
// 23.7 s, sys 3.1 s, 1.95 s/step after; sched_yield calls 724,000 → 108,000;
// bit-identical rollouts. OPENBLAS_NUM_THREADS=1 cut the CPU time further
// (user 21.5 s, sys 2.9 s) but made a step 1.1× slower and changed weight
// gradients in the last bits, so BLAS keeps its threads; their number
// follows policy.threads (SetThreads).
func UsePassiveOpenMP() {
	reexecWith(passiveEnv, false)
}

// passiveEnv are UsePassiveOpenMP's variables.
var passiveEnv = [][2]string{
	{"OMP_WAIT_POLICY", "PASSIVE"},
	{"OPENBLAS_THREAD_TIMEOUT", "4"},
}

// UseTrainingMalloc re-executes the running program with glibc malloc
// settings that keep tensors up to 32 MiB for reuse, unless they are all
// set already (a variable the user set is kept). By default glibc serves
// every tensor above 128 KiB with a fresh mmap and returns it with munmap,
// so each backward pass page-faults its activations in again; with these,
// the offline default's warm-up and GRPO steps ran about 1.4× faster (60
// SFT steps: 33 s, 29 s of it in the kernel, against 23 s). Batch-1
// decoding of the small preset, however, ran 3× slower, so only training
// commands call it, first thing in their action: glibc reads the variables
// only at start-up. Freed memory under the threshold is kept instead of
// being returned to the system.
//
// Tensors of 32 MiB and more (glibc's largest mmap threshold) still come
// from mmap and go back when freed: a large policy's logits, activations
// and embedding-sized gradients. Kept in the heap (a threshold of 16 GiB,
// as before), the holes they left did not fit what the optimizer step then
// allocated, and the peak grew by 0.5 to 1.4 GiB beyond what was live
// (bench/memory, 0.5B-shaped policies, docs/memory.md); each costs a
// page-faulting mmap per update instead, small beside its update. The tiny
// policy's tensors are nearly all below it (a rollout's KV cache of many
// rows can pass it: one mmap per rollout).
func UseTrainingMalloc() {
	reexecWith([][2]string{
		{"MALLOC_MMAP_THRESHOLD_", "33554432"},
		{"MALLOC_TRIM_THRESHOLD_", "17179869184"},
		{"MALLOC_TOP_PAD_", "268435456"},
	}, false)
}

// reexecWith sets the variables of env that are missing and re-executes the
// program with them (and with whatever else the caller set in os.Environ);
// it returns when none was missing and force is false, or the exec fails.
func reexecWith(env [][2]string, force bool) {
	missing := force
	for _, kv := range env {
		if _, ok := os.LookupEnv(kv[0]); !ok {
			os.Setenv(kv[0], kv[1])
			missing = true
		}
	}
	if !missing {
		return
	}
	exe, err := os.Executable()
	if err != nil {
		return
	}
	syscall.Exec(exe, os.Args, os.Environ()) // returns only on failure
}
