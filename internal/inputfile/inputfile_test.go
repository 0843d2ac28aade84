package inputfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestHostile: each hostile input ends at once with an error naming the
// path, never blocking (a FIFO with no writer blocks a plain open forever)
// and never reading without end (/dev/urandom).
func TestHostile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, make([]byte, 101), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(fifo, link); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, path, want string
	}{
		{"FIFO", fifo, "a FIFO"},
		{"symbolic link to a FIFO", link, "a FIFO"},
		{"endless device", "/dev/urandom", "a character device"},
		{"folder", dir, "a folder"},
		{"past the limit", big, "101 bytes, more than the limit of 100"},
		{"missing", filepath.Join(dir, "none"), "no such file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() {
				_, err := ReadFile(c.path, 100)
				done <- err
			}()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), c.path) || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("ReadFile(%s): error %v, want one naming the path and %q", c.path, err, c.want)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("ReadFile(%s) still blocked after 5 s; a hostile input must end at once", c.path)
			}
		})
	}
}

func TestReadFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := ReadFile(p, 5)
	if err != nil || string(b) != "hello" {
		t.Fatalf("ReadFile of a file at the limit: %q, %v; want its bytes", b, err)
	}
	f, err := Open(p)
	if err != nil {
		t.Fatalf("Open of a regular file: %v", err)
	}
	f.Close()
	if _, err := Open("/dev/null"); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("Open(/dev/null): %v, want ErrNotRegular", err)
	}
}
