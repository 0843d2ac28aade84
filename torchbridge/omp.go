package torchbridge

import (
	"os"
	"syscall"
)

// UsePassiveOpenMP re-executes the running program with
// OMP_WAIT_POLICY=PASSIVE unless the variable is already set. libgomp (which
// libtorch's CPU kernels use) reads it only when it is loaded, so it cannot
// be changed from inside the process. With the default, idle OpenMP threads
// spin, and on small machines they steal the cores from the Go runtime and
// from BLAS: measured on a 2-core VM, prefill ran 3.5× and batch-1 decode
// 2.6× slower. Call it first thing in main (and TestMain). It returns
// normally when the variable is set or the re-exec fails.
func UsePassiveOpenMP() {
	reexecWith([][2]string{{"OMP_WAIT_POLICY", "PASSIVE"}})
}

// UseTrainingMalloc re-executes the running program with glibc malloc
// settings that keep large tensors for reuse, unless they are all set
// already (a variable the user set is kept). By default glibc serves every
// large tensor with a fresh mmap and returns it with munmap, so each backward
// pass page-faults its activations in again; with these, the offline
// default's warm-up and GRPO steps ran about 1.4× faster (60 SFT steps: 33 s,
// 29 s of it in the kernel, against 23 s). Batch-1 decoding of the small
// preset, however, ran 3× slower, so only training commands call it, first
// thing in their action: glibc reads the variables only at start-up. Freed
// memory is kept instead of being returned to the system.
func UseTrainingMalloc() {
	reexecWith([][2]string{
		{"MALLOC_MMAP_THRESHOLD_", "17179869184"},
		{"MALLOC_TRIM_THRESHOLD_", "17179869184"},
		{"MALLOC_TOP_PAD_", "268435456"},
	})
}

// reexecWith sets the variables of env that are missing and re-executes the
// program with them; it returns when none was missing or the exec fails.
func reexecWith(env [][2]string) {
	missing := false
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
