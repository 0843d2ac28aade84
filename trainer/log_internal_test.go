package trainer

import (
	"errors"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A log write that fails part way (the file size limit here, a full disk
// in the field) leaves the log as it was, whole lines only: before, the
// lines written up to the failure stayed, the last one cut.
func TestAppendLinesTakesBackATornWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rollouts.jsonl")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := appendLines(f, []byte("{\"step\":1}\n")); err != nil {
		t.Fatal(err)
	}
	// RLIMIT_FSIZE stands in for a full disk: a write past it writes what
	// fits and fails (EFBIG, with SIGXFSZ ignored).
	signal.Ignore(syscall.SIGXFSZ)
	defer signal.Reset(syscall.SIGXFSZ)
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	lim := old
	lim.Cur = 64
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		t.Skipf("cannot lower the file size limit: %v", err)
	}
	err = appendLines(f, []byte(strings.Repeat("{\"step\":2,\"x\":\"yyyyyyyy\"}\n", 10)))
	if rerr := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old); rerr != nil {
		t.Fatal(rerr)
	}
	if !errors.Is(err, syscall.EFBIG) {
		t.Fatalf("appendLines past the size limit: %v, want EFBIG", err)
	}
	b, _ := os.ReadFile(path)
	if string(b) != "{\"step\":1}\n" {
		t.Fatalf("the log after a failed write holds %q; want its first line alone, no torn line", b)
	}
}
