package eval

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A --knn-log that is a FIFO no one writes is refused at once, naming it.
func TestKNNLogFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rollouts.jsonl")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := newKNN(Setup{KNNLog: path}); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "not a regular file") {
			t.Fatalf("newKNN with a FIFO: %v; want an error naming it as not a regular file", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("newKNN with a FIFO still blocked after 5 s")
	}
}

// An --extra-models file that is a FIFO no one writes is refused at once,
// naming it.
func TestExtraModelsFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "extra.toml")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := LoadExtraModels(path); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "not a regular file") {
			t.Fatalf("LoadExtraModels with a FIFO: %v; want an error naming it as not a regular file", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("LoadExtraModels with a FIFO still blocked after 5 s")
	}
}
