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
	if _, ok := os.LookupEnv("OMP_WAIT_POLICY"); ok {
		return
	}
	exe, err := os.Executable()
	if err != nil {
		return
	}
	os.Setenv("OMP_WAIT_POLICY", "PASSIVE")
	syscall.Exec(exe, os.Args, os.Environ()) // returns only on failure
}
