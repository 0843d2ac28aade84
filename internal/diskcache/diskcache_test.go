package diskcache

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// testEntry is an entry whose content checks itself, as the callers' do.
type testEntry struct {
	Header
	Text     string `json:"text"`
	Checksum string `json:"checksum"`
}

func (e *testEntry) Check() error {
	if Checksum([]byte(e.Text)) != e.Checksum {
		return errors.New("checksum mismatch")
	}
	return nil
}

func newEntry(text string) *testEntry {
	return &testEntry{Text: text, Checksum: Checksum([]byte(text))}
}

func open(t *testing.T, dir string, readOnly bool, logs *bytes.Buffer) *Cache {
	t.Helper()
	c, err := Open(Config{Dir: dir, Version: 3, ReadOnly: readOnly, Log: slog.New(slog.NewTextHandler(logs, nil)), Owner: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestGetChecksTheEnvelope: an entry reads back as written; a file that is
// not JSON, of another version or key, or whose content fails Check is a
// miss, removed in read-write mode and left in place in read-only mode.
func TestGetChecksTheEnvelope(t *testing.T) {
	t.Parallel()
	key, err := Key(struct{ V, Q string }{"3", "question"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		corrupt func(string) string
		wantLog string // "" for a valid entry
	}{
		{name: "valid", corrupt: func(s string) string { return s }},
		{name: "not JSON", corrupt: func(s string) string { return s[:len(s)/2] }, wantLog: "unexpected end of JSON"},
		{name: "another version", corrupt: func(s string) string { return strings.Replace(s, `"version":3`, `"version":2`, 1) },
			wantLog: "version 2, want 3"},
		{name: "another key", corrupt: func(s string) string { return strings.Replace(s, `"key":"`, `"key":"0`, 1) },
			wantLog: "key mismatch"},
		{name: "content fails Check", corrupt: func(s string) string { return strings.Replace(s, "answer", "Answer", 1) },
			wantLog: "checksum mismatch"},
	}
	for _, tc := range tests {
		for _, readOnly := range []bool{false, true} {
			name := tc.name + map[bool]string{false: ", read-write", true: ", read-only"}[readOnly]
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				dir := t.TempDir()
				var logs bytes.Buffer
				if err := open(t, dir, false, &logs).Put(key, newEntry("the answer")); err != nil {
					t.Fatal(err)
				}
				p := filepath.Join(dir, key[:2], key+".json")
				b, err := os.ReadFile(p)
				if err != nil {
					t.Fatalf("entry file: %v, want it at DIR/KK/KEY.json", err)
				}
				if err := os.WriteFile(p, []byte(tc.corrupt(string(b))), 0o644); err != nil {
					t.Fatal(err)
				}
				var got testEntry
				ok := open(t, dir, readOnly, &logs).Get(key, &got)
				_, statErr := os.Stat(p)
				if tc.wantLog == "" {
					if !ok || got.Text != "the answer" || got.Version != 3 || got.Key != key {
						t.Errorf("Get = %v, %+v; want the entry as written, with version 3 and its key", ok, got)
					}
					return
				}
				if ok {
					t.Errorf("Get of an invalid entry = %+v, want a miss", got)
				}
				if !strings.Contains(logs.String(), tc.wantLog) || !strings.Contains(logs.String(), "test: invalid cache entry") {
					t.Errorf("logs %q, want the owner's warning naming %q", logs.String(), tc.wantLog)
				}
				if readOnly && statErr != nil {
					t.Errorf("read-only Get removed the invalid entry (%v), want it left in place", statErr)
				}
				if !readOnly && !errors.Is(statErr, os.ErrNotExist) {
					t.Errorf("read-write Get left the invalid entry (stat: %v), want it removed", statErr)
				}
			})
		}
	}
}

// An entry that is a FIFO (a hostile cache folder) is a logged miss at
// once; the read never blocks.
func TestGetHostileEntry(t *testing.T) {
	key, err := Key(struct{ V, Q string }{"3", "question"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var logs bytes.Buffer
	c := open(t, dir, true, &logs)
	p := filepath.Join(dir, key[:2], key+".json")
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan bool, 1)
	go func() { var e testEntry; done <- c.Get(key, &e) }()
	select {
	case hit := <-done:
		if hit || !strings.Contains(logs.String(), "not a regular file") {
			t.Fatalf("Get of a FIFO entry: hit %v, logs %q; want a miss logged as not a regular file", hit, logs.String())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Get of a FIFO entry still blocked after 5 s")
	}
}

// TestReadOnlyWritesNothing: a read-only cache needs its folder and never
// writes into it.
func TestReadOnlyWritesNothing(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	if _, err := Open(Config{Dir: filepath.Join(t.TempDir(), "missing"), ReadOnly: true}); err == nil {
		t.Error("Open of a missing folder read-only succeeded, want an error (there is nothing to replay)")
	}
	dir := t.TempDir()
	key, _ := Key("k")
	if err := open(t, dir, true, &logs).Put(key, newEntry("x")); !errors.Is(err, ErrReadOnly) {
		t.Errorf("Put on a read-only cache = %v, want ErrReadOnly", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("read-only Put created %v, want nothing", entries)
	}
}
