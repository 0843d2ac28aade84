package data

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/parquet-go/parquet-go"
)

// checkLoaded holds what LoadFile promises of the examples it returns, and
// of its errors, for any input file.
func checkLoaded(t *testing.T, path string, lines int, exs []Example, err error) {
	t.Helper()
	if err != nil {
		if !strings.HasPrefix(err.Error(), "data: "+path) {
			t.Fatalf("error %q must start with data: and the file", err)
		}
		var pe *ParseError
		if errors.As(err, &pe) && (pe.Line < 0 || pe.Line > lines+1) {
			t.Fatalf("error %q names line %d of a file of %d lines", err, pe.Line, lines)
		}
		return
	}
	if len(exs) == 0 {
		t.Fatalf("LoadFile returned no example and no error; want an error for an empty file")
	}
	seen := map[string]bool{}
	for _, ex := range exs {
		q := ex.Question
		if q == "" || q != strings.TrimSpace(q) || !strings.HasSuffix(q, "?") {
			t.Fatalf("example %+v: want a trimmed, non-empty question ending in ?", ex)
		}
		if len(ex.Golden) == 0 {
			t.Fatalf("example %+v has no golden answer", ex)
		}
		for _, g := range ex.Golden {
			if g == "" || g != strings.TrimSpace(g) {
				t.Fatalf("example %+v: golden answer %q must be trimmed and non-empty", ex, g)
			}
		}
		if _, err := canonical(ex.Dataset); err != nil || ex.ID != ex.Dataset+"/"+ex.SourceID || strings.TrimSpace(ex.SourceID) == "" {
			t.Fatalf("example %+v: want a known dataset and ID = dataset/source id", ex)
		}
		for _, s := range append([]string{ex.ID, ex.Question}, ex.Golden...) {
			if !utf8.ValidString(s) {
				t.Fatalf("example %+v holds invalid UTF-8 %q: results files (JSON) would store another string", ex, s)
			}
		}
		if seen[ex.ID] {
			t.Fatalf("two examples with id %q", ex.ID)
		}
		seen[ex.ID] = true
	}
}

// FuzzLoadJSONL loads arbitrary bytes as a JSON Lines question file, with
// and without a dataset name for the file.
func FuzzLoadJSONL(f *testing.F) {
	for _, s := range []string{
		`{"id": "nq-open-dev-0", "question": "when was the last time anyone was on the moon", "golden_answers": ["14 December 1972 UTC", "December 1972"], "dataset": "nq"}`,
		"\xef\xbb\xbf{\"id\": 7, \"question\": \"q\", \"golden_answers\": [null, \" a \"], \"data_source\": \"2wikimultihopqa\"}\n\n",
		`{"question": "q", "reward_model": {"ground_truth": {"target": ["x"]}}, "data_source": "nq"}` + "\n" + `{"question": "r", "golden_answers": [], "reward_model": {"ground_truth": {"target": ["y"]}}}`,
		`{"id": "1", "question": "q", "golden_answers": ["a"], "dataset": "nq"}` + "\n" + `{"id": "1", "question": "q", "golden_answers": ["a"], "dataset": "nq"}`,
		`{"id": -12, "question": "q", "golden_answers": ["a"], "dataset": "hotpotqa", "data_source": "nq"}`,
		`{"id": 1.5, "question": 3, "golden_answers": "a"}`,
		`{"question": "\ud800 \u0000", "golden_answers": ["\udfff"], "dataset": "popqa"}`,
		"[1]\n{\n",
		"",
	} {
		f.Add([]byte(s), "")
		f.Add([]byte(s), "nq")
	}
	f.Fuzz(func(t *testing.T, b []byte, dataset string) {
		path := filepath.Join(t.TempDir(), "q.jsonl")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		exs, err := LoadFile(path, LoadOptions{Dataset: dataset})
		checkLoaded(t, path, bytes.Count(b, []byte("\n"))+1, exs, err)
	})
}

// FuzzLoadParquet loads arbitrary bytes as a Parquet question file: the
// Parquet reader sees corrupt files of every kind, and a panic inside it
// must come back as this file's error.
func FuzzLoadParquet(f *testing.F) {
	seeds, err := filepath.Glob("testdata/*.parquet")
	if err != nil || len(seeds) == 0 {
		f.Fatalf("no Parquet seeds in testdata (%v)", err)
	}
	for _, p := range seeds {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	f.Add([]byte("PAR1PAR1"))
	f.Add([]byte("PAR1\x00\x00\x00\x00PAR1"))
	f.Add([]byte("PAR1\xff\xff\xff\x7fPAR1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(t.TempDir(), "q.parquet")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		exs, err := LoadFile(path, LoadOptions{Dataset: "nq"})
		checkLoaded(t, path, 1<<30, exs, err)
	})
}

// TestLoadRepairsInvalidUTF8 loads a Parquet file whose strings hold invalid
// UTF-8 (Parquet strings are bytes; JSON decoding already repairs them):
// the example holds valid UTF-8, so that its id and question are the same
// after a JSON round trip through the results and outcome files.
func TestLoadRepairsInvalidUTF8(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f.parquet")
	fx := fixture{
		name: "invalid_utf8",
		schema: parquet.NewSchema("schema", parquet.Group{
			"id":             optString(),
			"question":       optString(),
			"golden_answers": stringList("element"),
		}),
		rows: []fixtureRow{{"id": "a\xff", "question": "who\xc0 wrote it", "golden_answers.list.element": []string{"x\xed\xa0\x80y"}}},
	}
	b, err := fx.build()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	exs, err := LoadFile(path, LoadOptions{Dataset: "nq"})
	if err != nil {
		t.Fatal(err)
	}
	want := Example{ID: "nq/a\uFFFD", SourceID: "a\uFFFD", Dataset: "nq", Question: "who\uFFFD wrote it?", Golden: []string{"x\uFFFDy"}}
	if len(exs) != 1 || exs[0].ID != want.ID || exs[0].SourceID != want.SourceID || exs[0].Question != want.Question || !slices.Equal(exs[0].Golden, want.Golden) {
		t.Fatalf("LoadFile = %+v, want %+v: invalid UTF-8 replaced by U+FFFD", exs, want)
	}
}
