package torchbridge_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/cpu"

	"github.com/recal-project/recal/torchbridge"
)

// blasChildEnv makes the test binary a child of TestUseFastBLAS: it runs
// UseFastBLAS (which may re-execute it) and prints CurrentBLAS as JSON.
const blasChildEnv = "RECAL_TEST_BLAS_CHILD"

// TestBLASChild is the child's body; it does nothing in a normal run.
func TestBLASChild(t *testing.T) {
	if os.Getenv(blasChildEnv) == "" {
		t.Skip("the child process of TestUseFastBLAS")
	}
	torchbridge.UseFastBLAS()
	b, _ := json.Marshal(torchbridge.CurrentBLAS())
	fmt.Printf("BLAS %s\n", b)
}

// blasIn runs the child under env (assignments added to this process's
// environment, less OPENBLAS_CORETYPE, RECAL_BLAS_AUTO and RECAL_BLAS_REPLACED)
// and returns what it reports.
func blasIn(t *testing.T, env ...string) torchbridge.BLASKernel {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestBLASChild$", "-test.count=1", "-test.v")
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		for _, k := range []string{"OPENBLAS_CORETYPE=", torchbridge.BLASAutoEnv + "=", "RECAL_BLAS_REPLACED="} {
			if strings.HasPrefix(kv, k) {
				return true
			}
		}
		return false
	})
	cmd.Env = append(cmd.Env, append([]string{blasChildEnv + "=1"}, env...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child under %v: %v\n%s", env, err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if js, ok := strings.CutPrefix(line, "BLAS "); ok {
			var k torchbridge.BLASKernel
			if err := json.Unmarshal([]byte(js), &k); err != nil {
				t.Fatalf("child under %v: %v", env, err)
			}
			return k
		}
	}
	t.Fatalf("child under %v printed no BLAS line:\n%s", env, out)
	return torchbridge.BLASKernel{}
}

// widest is the kernel of the widest vector instructions this CPU runs,
// among those `make test-kernels` covers: an independent statement of
// UseFastBLAS's table.
func widest() (kernel string, rank int) {
	x := cpu.X86
	switch {
	case x.HasAVX512F && x.HasAVX512CD && x.HasAVX512BW && x.HasAVX512DQ && x.HasAVX512VL:
		return "SkylakeX", 3
	case x.HasAVX2 && x.HasFMA:
		return "Haswell", 2
	case x.HasAVX:
		return "Sandybridge", 1
	}
	return "", 0
}

// rankOf is the vector width rank of an OpenBLAS kernel name (0: SSE era).
func rankOf(core string) int {
	switch strings.ToLower(core) {
	case "skylakex", "cooperlake", "sapphirerapids":
		return 3
	case "haswell", "zen", "excavator":
		return 2
	case "sandybridge", "bulldozer", "piledriver", "steamroller":
		return 1
	}
	return 0
}

// TestUseFastBLAS: a kernel set in the environment is kept and said to be;
// RECAL_BLAS_AUTO=off keeps OpenBLAS's own choice; otherwise recal runs the
// CPU's widest kernel where OpenBLAS picked an older one, and says why.
func TestUseFastBLAS(t *testing.T) {
	own := blasIn(t, torchbridge.BLASAutoEnv+"=off")
	if own.Core == "" {
		t.Skipf("libtorch's BLAS is not OpenBLAS (%s): nothing to choose", own.Why)
	}
	if !strings.Contains(own.Why, "kept by RECAL_BLAS_AUTO=off") {
		t.Errorf("RECAL_BLAS_AUTO=off: reason %q, want it to say the automatic choice is off", own.Why)
	}
	t.Logf("OpenBLAS's own choice: %s; CPU %s", own.Core, own.CPU)

	if _, r := widest(); r >= 1 {
		got := blasIn(t, "OPENBLAS_CORETYPE=Sandybridge")
		if got.Core != "Sandybridge" || got.Why != "OPENBLAS_CORETYPE=Sandybridge in the environment" {
			t.Errorf("OPENBLAS_CORETYPE=Sandybridge: got %s, want Sandybridge kept and said to come from the environment", got)
		}
	}

	// A name OpenBLAS does not know is kept (recal never rewrites a setting)
	// and the log says OpenBLAS ran another kernel.
	if got := blasIn(t, "OPENBLAS_CORETYPE=NoSuchCore"); !strings.HasPrefix(got.Why, "OPENBLAS_CORETYPE=NoSuchCore in the environment, which OpenBLAS did not load") {
		t.Errorf("OPENBLAS_CORETYPE=NoSuchCore: got %s, want it kept and said not to be the kernel OpenBLAS loaded", got)
	}

	auto := blasIn(t)
	want, wr := widest()
	if rankOf(own.Core) >= wr {
		want = own.Core
	}
	if auto.Core != want {
		t.Errorf("automatic choice: %s, want %s (OpenBLAS's own %s on a CPU whose widest kernel is %q)", auto, want, own.Core, want)
	}
	if chosen := strings.HasPrefix(auto.Why, "chosen by recal: OpenBLAS picked "+own.Core); chosen != (auto.Core != own.Core) {
		t.Errorf("automatic choice: reason %q; it must say recal chose it exactly when it differs from OpenBLAS's own %s", auto.Why, own.Core)
	}
}
