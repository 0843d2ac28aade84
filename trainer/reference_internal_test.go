package trainer

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/recal-project/recal/internal/testing/testpolicy"
	"github.com/recal-project/recal/torchbridge"
)

// A KL reference reloaded for each scoring (policy.reload_reference) gives
// the resident reference's log-probs bit for bit, holds no policy between
// scorings, and a reference that does not load fails at start, naming it.
func TestReloadedReference(t *testing.T) {
	dir := testpolicy.Micro(t, "..", 1)
	opt := torchbridge.Options{DType: "float32"}
	seqs := func() []torchbridge.Sequence {
		var out []torchbridge.Sequence
		for r := range 5 { // 5 sequences in micro-batches of 2: a short last one
			s := torchbridge.Sequence{}
			for k := range 9 + r {
				s.Tokens = append(s.Tokens, int32(3+(7*k+r)%40))
				s.Mask = append(s.Mask, float32(min(k/4, 1)))
			}
			out = append(out, s)
		}
		return out
	}
	ctx := context.Background()
	score := func(reload bool) []torchbridge.Sequence {
		ref, err := openReference(dir, opt, reload)
		if err != nil {
			t.Fatal(err)
		}
		defer ref.Close()
		if (ref.resident == nil) != reload {
			t.Fatalf("reload %v: resident policy %v", reload, ref.resident)
		}
		s := seqs()
		for range 2 { // twice: a reloaded reference is loaded again
			if err := ref.score(ctx, s, 2); err != nil {
				t.Fatal(err)
			}
		}
		if reload && ref.resident != nil {
			t.Error("a reloaded reference stays in memory after scoring")
		}
		return s
	}
	a, b := score(false), score(true)
	for i := range a {
		if len(a[i].RefLogp) != len(a[i].Tokens) || !slices.Equal(a[i].RefLogp, b[i].RefLogp) {
			t.Errorf("sequence %d: reloaded reference log-probs %v, resident %v", i, b[i].RefLogp, a[i].RefLogp)
		}
	}

	// A reloaded reference whose checkpoint changes during the run fails
	// the next scoring, naming it, instead of scoring against other weights.
	moved := filepath.Join(t.TempDir(), "ref")
	if err := os.CopyFS(moved, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	ref, err := openReference(moved, opt, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := ref.score(ctx, seqs(), 2); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(moved, "config.json"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("\n")
	f.Close()
	if err := ref.score(ctx, seqs(), 2); err == nil || !strings.Contains(err.Error(), "changed since the run started") || !strings.Contains(err.Error(), moved) {
		t.Errorf("scoring after the reference's checkpoint changed: %v, want an error naming %s", err, moved)
	}

	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "config.json"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, reload := range []bool{false, true} {
		_, err := openReference(bad, opt, reload)
		if err == nil || !strings.Contains(err.Error(), "KL reference") || !strings.Contains(err.Error(), bad) {
			t.Errorf("reload %v: a reference that does not load: %v, want an error at start naming the KL reference and %s", reload, err, bad)
		}
	}
}
