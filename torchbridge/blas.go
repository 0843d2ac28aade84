package torchbridge

/*
#include <stdlib.h>
#include "recal.h"
*/
import "C"

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/cpu"
)

// The variables of the BLAS kernel choice (UseFastBLAS).
const (
	// BLASAutoEnv turns the automatic choice off when set to "off" (or "0",
	// "false", "no"): OpenBLAS then keeps its own choice for the CPU.
	BLASAutoEnv = "RECAL_BLAS_AUTO"
	// blasReplacedEnv carries, into the re-executed process, the kernel
	// OpenBLAS had picked by itself, so that CurrentBLAS can say why the
	// kernel in use was chosen.
	blasReplacedEnv = "RECAL_BLAS_REPLACED"
)

// Instruction-set tiers of OpenBLAS's x86-64 kernels, slowest first: the
// kernel families of OpenBLAS 0.3.21's DYNAMIC_ARCH build, by the widest
// vector instructions their sgemm uses.
const (
	tierSSE = iota
	tierAVX
	tierAVX2
	tierAVX512
)

// kernelTier is the tier of each OpenBLAS core name (lower case) above SSE;
// every other name (Prescott, Core2, Nehalem, Barcelona, ...) is an SSE-era
// kernel.
var kernelTier = map[string]int{
	"sandybridge": tierAVX, "bulldozer": tierAVX, "piledriver": tierAVX, "steamroller": tierAVX,
	"haswell": tierAVX2, "zen": tierAVX2, "excavator": tierAVX2,
	"skylakex": tierAVX512, "cooperlake": tierAVX512, "sapphirerapids": tierAVX512,
}

// tierKernel is the kernel recal chooses for a CPU of each tier: one
// kernel per tier, each among those `make test-kernels` proves bit-for-bit
// deterministic (BLAS_CORES). SkylakeX over Cooperlake: on an Intel Xeon
// (Emerald Rapids) single-thread 1024² sgemm ran at 168 GFLOP/s with
// SkylakeX, 158 with Cooperlake (docs/results/benchmarks.md).
var tierKernel = [...]string{tierAVX: "Sandybridge", tierAVX2: "Haswell", tierAVX512: "SkylakeX"}

// cpuTier is the widest kernel tier this CPU and its operating system run,
// read from CPUID (x/sys/cpu checks that the OS saves the vector state).
func cpuTier() int {
	x := cpu.X86
	switch {
	case x.HasAVX512F && x.HasAVX512CD && x.HasAVX512BW && x.HasAVX512DQ && x.HasAVX512VL:
		return tierAVX512
	case x.HasAVX2 && x.HasFMA:
		return tierAVX2
	case x.HasAVX:
		return tierAVX
	}
	return tierSSE
}

// betterKernel returns the kernel to run instead of loaded, the one
// OpenBLAS picked, on a CPU of tier cpu: the tier's kernel when loaded is
// of a lower tier (OpenBLAS did not recognise the CPU model and fell back,
// as Debian's 0.3.21 does to Prescott on Intel's Emerald Rapids), else "".
func betterKernel(loaded string, cpu int) string {
	if loaded == "" || cpu <= tierSSE || kernelTier[strings.ToLower(loaded)] >= cpu {
		return ""
	}
	return tierKernel[cpu]
}

// autoOff reports whether the environment turns the automatic choice off.
func autoOff() bool {
	switch strings.ToLower(strings.TrimSpace(os.Getenv(BLASAutoEnv))) {
	case "off", "0", "false", "no":
		return true
	}
	return false
}

// UseFastBLAS re-executes the running program with OPENBLAS_CORETYPE set
// to the fastest OpenBLAS kernel this CPU's instruction set runs, when
// OpenBLAS picked a kernel of an older instruction set by itself. It does
// nothing when OPENBLAS_CORETYPE is set (a choice made in the environment
// is kept as it is), when RECAL_BLAS_AUTO=off, when libtorch's BLAS is not
// OpenBLAS, or when OpenBLAS's choice already uses the CPU's widest
// vectors. OpenBLAS reads the variable only when it is loaded, before main
// runs, hence the re-execution; the variables of UsePassiveOpenMP are set
// in the same one. Call it first thing in main, before UsePassiveOpenMP;
// CurrentBLAS then says which kernel runs and why. It returns normally
// when nothing is to change or the re-exec fails.
//
// Debian 12's OpenBLAS 0.3.21 does not know Intel's Emerald Rapids (family
// 6, model 207) and runs its SSE3 "Prescott" kernels there: single-thread
// 1024² sgemm 35 GFLOP/s against 168 with SkylakeX, and recal's training
// about twice as slow (docs/results/benchmarks.md).
func UseFastBLAS() {
	if _, set := os.LookupEnv("OPENBLAS_CORETYPE"); set || autoOff() {
		return
	}
	loaded, _ := blasKernel()
	want := betterKernel(loaded, cpuTier())
	if want == "" {
		return
	}
	os.Setenv("OPENBLAS_CORETYPE", want)
	os.Setenv(blasReplacedEnv, loaded)
	reexecWith(passiveEnv, true)
}

// BLASKernel describes the BLAS kernel the process runs.
type BLASKernel struct {
	// Core is the kernel as OpenBLAS names it ("SkylakeX"), "" when
	// libtorch's BLAS is not OpenBLAS.
	Core string
	// Config is OpenBLAS's build summary (version, DYNAMIC_ARCH, ...).
	Config string
	// Why says how the kernel was chosen.
	Why string
	// CPU names the processor: its model name, vendor, family and model
	// numbers as /proc/cpuinfo gives them ("" where it cannot be read).
	CPU string
}

// String is the kernel and the reason, for logs and dry runs.
func (k BLASKernel) String() string {
	if k.Core == "" {
		return "not OpenBLAS (" + k.Why + ")"
	}
	return "OpenBLAS " + k.Core + " (" + k.Why + ")"
}

// CurrentBLAS says which BLAS kernel this process runs, and why.
func CurrentBLAS() BLASKernel {
	core, config := blasKernel()
	k := BLASKernel{Core: core, Config: config, CPU: cpuModel()}
	env, set := os.LookupEnv("OPENBLAS_CORETYPE")
	replaced := os.Getenv(blasReplacedEnv)
	better := betterKernel(core, cpuTier())
	switch {
	case core == "":
		k.Why = "libtorch's BLAS does not report an OpenBLAS kernel"
	case set && replaced != "" && strings.EqualFold(env, core):
		k.Why = fmt.Sprintf("chosen by recal: OpenBLAS picked %s, older than this CPU's instruction set; %s=off keeps OpenBLAS's choice", replaced, BLASAutoEnv)
	case set && !strings.EqualFold(env, core):
		k.Why = fmt.Sprintf("OPENBLAS_CORETYPE=%s in the environment, which OpenBLAS did not load (a name it does not know, or a kernel this CPU cannot run): it runs %s instead", env, core)
	case set:
		k.Why = fmt.Sprintf("OPENBLAS_CORETYPE=%s in the environment", env)
	case autoOff() && better != "":
		k.Why = fmt.Sprintf("OpenBLAS's own choice, kept by %s=off; this CPU runs %s", BLASAutoEnv, better)
	case autoOff():
		k.Why = fmt.Sprintf("OpenBLAS's own choice, kept by %s=off", BLASAutoEnv)
	case better != "":
		// UseFastBLAS was not called (tests, libraries) or its re-exec failed.
		k.Why = fmt.Sprintf("OpenBLAS's own choice; this CPU runs %s (recal's commands choose it)", better)
	default:
		k.Why = "OpenBLAS's own choice for this CPU"
	}
	return k
}

// blasKernel asks the loaded OpenBLAS for its kernel and build summary
// ("" and "" when the BLAS is not OpenBLAS). It needs no torch state, so it
// runs on the calling goroutine, before the torch thread starts.
func blasKernel() (core, config string) {
	var c [64]C.char
	var g [256]C.char
	var msg *C.char
	if status(C.rc_blas_kernel(&c[0], C.int32_t(len(c)), &g[0], C.int32_t(len(g)), &msg), msg) != nil {
		return "", ""
	}
	return C.GoString((*C.char)(unsafe.Pointer(&c[0]))), strings.TrimSpace(C.GoString((*C.char)(unsafe.Pointer(&g[0]))))
}

// cpuModel is the first processor's model name, vendor, family and model
// from /proc/cpuinfo: "Intel(R) Xeon(R) Processor (GenuineIntel family 6
// model 207)".
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	fields := map[string]string{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := s.Text()
		if line == "" {
			break // the first processor's block ends
		}
		k, v, ok := strings.Cut(line, ":")
		if ok {
			fields[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	name := fields["model name"]
	if fields["vendor_id"] == "" {
		return name
	}
	return fmt.Sprintf("%s (%s family %s model %s)", name, fields["vendor_id"], fields["cpu family"], fields["model"])
}
