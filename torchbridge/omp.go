package torchbridge

import (
	"os"
	"syscall"
)

// passiveOpenMP: libgomp (libtorch's CPU kernels) reads OMP_WAIT_POLICY only
// when it is loaded. With the default, idle OpenMP threads spin, and on small
// machines they steal the cores from the Go runtime and from BLAS: measured
// on a 2-core VM, prefill ran 3.5× and batch-1 decode 2.6× slower.
var passiveOpenMP = [][2]string{{"OMP_WAIT_POLICY", "PASSIVE"}}

// trainingMalloc: glibc malloc reads these at start-up. By default it serves
// every large tensor with a fresh mmap and returns it with munmap, so each
// backward pass page-faults its activations in again. With these, the
// offline default's warm-up and GRPO steps ran about 1.4× faster (60 SFT
// steps: 33 s, 29 s of it in the kernel, against 23 s); batch-1 decoding of
// the small preset, however, ran 3× slower, so only training asks for them.
// Freed memory is kept for reuse instead of being returned to the system.
var trainingMalloc = [][2]string{
	{"MALLOC_MMAP_THRESHOLD_", "17179869184"},
	{"MALLOC_TRIM_THRESHOLD_", "17179869184"},
	{"MALLOC_TOP_PAD_", "268435456"},
}

// UsePassiveOpenMP re-executes the running program with
// OMP_WAIT_POLICY=PASSIVE unless the variable is already set, and, when
// training, with the malloc settings of trainingMalloc that are not set. A
// variable the user set is kept. They are read only when the process
// starts, so they cannot be changed from inside. Call it first thing in main
// (and TestMain). It returns normally when nothing is missing or the re-exec
// fails.
func UsePassiveOpenMP(training bool) {
	env := passiveOpenMP
	if training {
		env = append(env[:len(env):len(env)], trainingMalloc...)
	}
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
