package baselines

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// FuzzLoadMatrix reads arbitrary pool.json and outcomes.jsonl files (a
// collect folder may be torn by a kill or edited by hand): no panic, an
// error that names the baselines package, and a matrix whose rows match its
// questions and models.
func FuzzLoadMatrix(f *testing.F) {
	pool := `{"version":1,"id":"sha256:ab","models":[{"name":"a","price_in":1},{"name":"b"}]}`
	row := func(q, m string) string {
		return `{"question_id":"` + q + `","dataset":"nq","question":"Q?","golden_answers":["x"],"model":"` + m + `","f1":0.5,"em":0,"cost":0.001}` + "\n"
	}
	f.Add([]byte(pool), []byte(row("nq/1", "a")+row("nq/1", "b")+row("nq/2", "a")))
	f.Add([]byte(pool), []byte(row("nq/1", "a")+row("nq/1", "b")+`{"question_id":"nq/2","mod`))
	f.Add([]byte(`{"version":1,"id":"x","models":[{"name":"a"},{"name":"a"}]}`), []byte(row("q", "a")))
	f.Add([]byte(`{"version":2,"id":"x","models":[{"name":"a"}]}`), []byte(row("q", "a")))
	f.Add([]byte(`{}`), []byte(""))
	f.Add([]byte(pool), []byte("\n\n[1,2]\nnull\n"+row("", "a")))
	f.Fuzz(func(t *testing.T, poolJSON, outcomes []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, PoolFile), poolJSON, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, OutcomesFile), outcomes, 0o644); err != nil {
			t.Fatal(err)
		}
		m, err := LoadMatrix(dir)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "baselines: ") {
				t.Fatalf("error %q lacks the baselines: prefix", err)
			}
			if errors.Is(err, os.ErrNotExist) {
				t.Fatalf("error %q: both files exist", err)
			}
			return
		}
		n := len(m.Questions)
		if n == 0 || len(m.F1) != n || len(m.EM) != n || len(m.Cost) != n || len(m.Failed) != n {
			t.Fatalf("matrix of %d questions with %d/%d/%d/%d rows", n, len(m.F1), len(m.EM), len(m.Cost), len(m.Failed))
		}
		if !slices.IsSortedFunc(m.Questions, func(a, b Question) int { return strings.Compare(a.ID, b.ID) }) {
			t.Fatalf("questions not sorted by ID: %v", m.Questions)
		}
		for i := range n {
			if len(m.F1[i]) != len(m.Models) || len(m.EM[i]) != len(m.Models) || len(m.Cost[i]) != len(m.Models) || len(m.Failed[i]) != len(m.Models) {
				t.Fatalf("row %d does not have one entry per model (%d)", i, len(m.Models))
			}
			if i > 0 && m.Questions[i].ID == m.Questions[i-1].ID {
				t.Fatalf("question %q appears twice", m.Questions[i].ID)
			}
		}
		if !strings.HasPrefix(m.Digest, "sha256:") {
			t.Fatalf("digest %q", m.Digest)
		}
	})
}

// An outcomes.jsonl or pool.json that is not a regular file (a FIFO no one
// writes) is refused at once, naming it, never waited on.
func TestLoadMatrixHostileFiles(t *testing.T) {
	for _, name := range []string{PoolFile, OutcomesFile} {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, PoolFile), []byte(`{"version":1,"id":"sha256:ab","models":[{"name":"a"}]}`), 0o644)
		path := filepath.Join(dir, name)
		os.Remove(path)
		if err := syscall.Mkfifo(path, 0o600); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { _, err := LoadMatrix(dir); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "not a regular file") {
				t.Errorf("LoadMatrix with a FIFO %s: %v; want an error naming it as not a regular file", name, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("LoadMatrix with a FIFO %s still blocked after 5 s", name)
		}
	}
}
