package torchbridge

import (
	"os"
	"syscall"
)

// runtimeEnv is the environment UseCPURuntimeEnv sets when it is missing.
var runtimeEnv = [][2]string{
	// libgomp (libtorch's CPU kernels) reads it only when it is loaded. With
	// the default, idle OpenMP threads spin, and on small machines they steal
	// the cores from the Go runtime and from BLAS: measured on a 2-core VM,
	// prefill ran 3.5× and batch-1 decode 2.6× slower.
	{"OMP_WAIT_POLICY", "PASSIVE"},
	// glibc malloc reads these at start-up. By default it serves every
	// large tensor with a fresh mmap and gives it back with munmap, so each
	// forward and backward pass page-faults its activations in again: 60
	// SFT steps of the offline default took 33 s (29 s of it in the kernel)
	// and take 23 s with these. Freed memory is kept for reuse instead of
	// being returned to the system.
	{"MALLOC_MMAP_THRESHOLD_", "17179869184"},
	{"MALLOC_TRIM_THRESHOLD_", "17179869184"},
	{"MALLOC_TOP_PAD_", "268435456"},
}

// UseCPURuntimeEnv re-executes the running program with the variables of
// runtimeEnv that are not set yet; a variable the user set is kept. They are
// read only when the process starts, so they cannot be changed from inside.
// Call it first thing in main (and TestMain). It returns normally when
// nothing is missing or the re-exec fails.
func UseCPURuntimeEnv() {
	missing := false
	for _, kv := range runtimeEnv {
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
