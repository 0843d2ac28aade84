package data

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

// writeFile writes content to name in a fresh temporary folder and returns
// its path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestVendoredFiles loads every vendored file; the row counts are those of
// data/qa/SOURCES.md.
func TestVendoredFiles(t *testing.T) {
	tests := []struct {
		file  string
		rows  int
		first Example
	}{
		{"nq/test.jsonl", 500, Example{ID: "nq/nq-open-dev-0", SourceID: "nq-open-dev-0", Dataset: "nq",
			Question: "when was the last time anyone was on the moon?", Golden: []string{"14 December 1972 UTC", "December 1972"}}},
		{"nq/train.jsonl", 3569, Example{ID: "nq/nq-efficientqa-dev-0", SourceID: "nq-efficientqa-dev-0", Dataset: "nq",
			Question: "the last time la dodgers won the world series?", Golden: []string{"1988"}}},
		{"triviaqa/test.jsonl", 500, Example{}},
		{"popqa/test.jsonl", 500, Example{}},
		{"hotpotqa/test.jsonl", 500, Example{ID: "hotpotqa/hotpotqa-dev-0", SourceID: "hotpotqa-dev-0", Dataset: "hotpotqa",
			Question: "Were Scott Derrickson and Ed Wood of the same nationality?", Golden: []string{"yes"}}},
		{"hotpotqa/train.jsonl", 741, Example{}},
		{"2wiki/test.jsonl", 500, Example{}},
		{"musique/test.jsonl", 500, Example{}},
		{"bamboogle/test.jsonl", 125, Example{ID: "bamboogle/bamboogle-0", SourceID: "bamboogle-0", Dataset: "bamboogle",
			Question: "Who was president of the United States in the year that Citibank was founded?", Golden: []string{"james madison"}}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			ds := strings.Split(tt.file, "/")[0]
			got, err := LoadFile(filepath.Join("qa", tt.file), LoadOptions{Dataset: ds})
			if err != nil {
				t.Fatalf("LoadFile: %v; want the vendored file to load", err)
			}
			if len(got) != tt.rows {
				t.Errorf("%d examples, want %d (SOURCES.md)", len(got), tt.rows)
			}
			if tt.first.ID != "" && !reflect.DeepEqual(got[0], tt.first) {
				t.Errorf("first example = %+v\nwant %+v", got[0], tt.first)
			}
			for _, ex := range got {
				if ex.Dataset != ds || !strings.HasPrefix(ex.ID, ds+"/") || !strings.HasSuffix(ex.Question, "?") || len(ex.Golden) == 0 {
					t.Fatalf("example %+v: want dataset %s, id prefixed %q, question ending in \"?\", golden answers", ex, ds, ds+"/")
				}
			}
		})
	}
}

func TestLoadJSONL(t *testing.T) {
	tests := []struct {
		name    string
		content string
		opts    LoadOptions
		want    []Example
	}{
		{
			name:    "cleaning",
			content: `{"id": "q1", "question": "  who wrote hamlet  ", "golden_answers": [" Shakespeare ", "", "  ", null, "W. Shakespeare"], "dataset": "popqa"}` + "\n",
			want:    []Example{{ID: "popqa/q1", SourceID: "q1", Dataset: "popqa", Question: "who wrote hamlet?", Golden: []string{"Shakespeare", "W. Shakespeare"}}},
		},
		{
			name: "no id uses the 0-based row index, blank lines do not count",
			content: `{"question": "a?", "golden_answers": ["x"]}` + "\n\n" +
				`{"question": "b?", "golden_answers": ["y"]}` + "\n",
			opts: LoadOptions{Dataset: "nq"},
			want: []Example{
				{ID: "nq/0", SourceID: "0", Dataset: "nq", Question: "a?", Golden: []string{"x"}},
				{ID: "nq/1", SourceID: "1", Dataset: "nq", Question: "b?", Golden: []string{"y"}},
			},
		},
		{
			name:    "integer id, alias in data_source, CRLF and BOM, no final newline",
			content: "\xef\xbb\xbf" + `{"id": 7, "question": "q", "golden_answers": ["a"], "data_source": "2wikimultihopqa"}` + "\r\n" + `{"id": -8, "question": "r", "golden_answers": ["b"], "data_source": "2wiki", "dataset": "2wikimultihopqa"}`,
			want: []Example{
				{ID: "2wiki/7", SourceID: "7", Dataset: "2wiki", Question: "q?", Golden: []string{"a"}},
				{ID: "2wiki/-8", SourceID: "-8", Dataset: "2wiki", Question: "r?", Golden: []string{"b"}},
			},
		},
		{
			name: "Search-R1 row: answers only under reward_model.ground_truth.target",
			content: `{"id": "train_0", "question": "q", "data_source": "nq", "prompt": [{"role": "user", "content": "..."}],` +
				` "reward_model": {"style": "rule", "ground_truth": {"target": ["a", "b"]}}, "extra_info": {"index": 0}}` + "\n",
			want: []Example{{ID: "nq/train_0", SourceID: "train_0", Dataset: "nq", Question: "q?", Golden: []string{"a", "b"}}},
		},
		{
			name:    "golden_answers wins over reward_model, whose shape is then not checked",
			content: `{"id": "1", "question": "q", "golden_answers": ["a"], "dataset": "nq", "reward_model": 5}` + "\n",
			want:    []Example{{ID: "nq/1", SourceID: "1", Dataset: "nq", Question: "q?", Golden: []string{"a"}}},
		},
		{
			name: "mixed file named for one dataset keeps its rows",
			content: `{"id": "0", "question": "q", "golden_answers": ["a"], "data_source": "nq"}` + "\n" +
				`{"id": "0", "question": "r", "golden_answers": ["b"], "data_source": "hotpotqa"}` + "\n",
			opts: LoadOptions{Dataset: "hotpotqa"},
			want: []Example{{ID: "hotpotqa/0", SourceID: "0", Dataset: "hotpotqa", Question: "r?", Golden: []string{"b"}}},
		},
		{
			name: "same source id in two datasets gives two global ids",
			content: `{"id": "0", "question": "q", "golden_answers": ["a"], "data_source": "nq"}` + "\n" +
				`{"id": "0", "question": "r", "golden_answers": ["b"], "data_source": "hotpotqa"}` + "\n",
			want: []Example{
				{ID: "nq/0", SourceID: "0", Dataset: "nq", Question: "q?", Golden: []string{"a"}},
				{ID: "hotpotqa/0", SourceID: "0", Dataset: "hotpotqa", Question: "r?", Golden: []string{"b"}},
			},
		},
		{
			name:    "forced dataset ignores the rows' names",
			content: `{"id": "0", "question": "q", "golden_answers": ["a"], "data_source": "my_custom_nq"}` + "\n",
			opts:    LoadOptions{Dataset: "nq", Force: true},
			want:    []Example{{ID: "nq/0", SourceID: "0", Dataset: "nq", Question: "q?", Golden: []string{"a"}}},
		},
		{
			name:    "line longer than the read buffer",
			content: `{"id": "0", "question": "` + strings.Repeat("x", 200_000) + `", "golden_answers": ["a"], "dataset": "nq"}` + "\n",
			want:    []Example{{ID: "nq/0", SourceID: "0", Dataset: "nq", Question: strings.Repeat("x", 200_000) + "?", Golden: []string{"a"}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, "f.jsonl", tt.content)
			got, err := LoadFile(path, tt.opts)
			if err != nil {
				t.Fatalf("LoadFile: %v; want success", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestLoadJSONLErrors(t *testing.T) {
	ok := `{"id": "1", "question": "q", "golden_answers": ["a"], "dataset": "nq"}` + "\n"
	tests := []struct {
		name    string
		content string
		opts    LoadOptions
		want    string // the error message after "data: <path>"
		is      error
	}{
		{"malformed JSON", ok + `{"id": "2", "question": "q", ` + "\n", LoadOptions{}, `:2: malformed JSON`, nil},
		{"not an object", `["q", ["a"]]` + "\n", LoadOptions{}, `:1: want a JSON object`, nil},
		{"golden_answers a string", `{"question": "q", "golden_answers": "a", "dataset": "nq"}`, LoadOptions{}, `:1: field "golden_answers": want list of strings`, nil},
		{"golden_answers numbers", ok + `{"question": "q", "golden_answers": [1, 2], "dataset": "nq"}`, LoadOptions{}, `:2: field "golden_answers": want list of strings`, nil},
		{"golden_answers missing", `{"question": "q", "dataset": "nq"}`, LoadOptions{}, `:1: field "golden_answers": missing (and no reward_model.ground_truth.target)`, nil},
		{"golden_answers all blank", `{"question": "q", "golden_answers": ["", " "], "dataset": "nq"}`, LoadOptions{}, `:1: field "golden_answers": no non-empty golden answer`, ErrNoGolden},
		{"target blank", `{"question": "q", "reward_model": {"ground_truth": {"target": [" "]}}, "dataset": "nq"}`, LoadOptions{}, `:1: field "reward_model.ground_truth.target": no non-empty golden answer`, ErrNoGolden},
		{"ground_truth not an object", `{"question": "q", "reward_model": {"ground_truth": ["a"]}, "dataset": "nq"}`, LoadOptions{}, `:1: field "reward_model.ground_truth": want object`, nil},
		{"target not a list", `{"question": "q", "reward_model": {"ground_truth": {"target": "a"}}, "dataset": "nq"}`, LoadOptions{}, `:1: field "reward_model.ground_truth.target": want list of strings`, nil},
		{"question missing", `{"golden_answers": ["a"], "dataset": "nq"}`, LoadOptions{}, `:1: field "question": missing`, nil},
		{"question a number", `{"question": 3, "golden_answers": ["a"], "dataset": "nq"}`, LoadOptions{}, `:1: field "question": want string`, nil},
		{"question blank", `{"question": "  ", "golden_answers": ["a"], "dataset": "nq"}`, LoadOptions{}, `:1: field "question": empty`, nil},
		{"id a float", `{"id": 1.5, "question": "q", "golden_answers": ["a"], "dataset": "nq"}`, LoadOptions{}, `:1: field "id": want string or integer`, nil},
		{"id blank", `{"id": " ", "question": "q", "golden_answers": ["a"], "dataset": "nq"}`, LoadOptions{}, `:1: field "id": empty`, nil},
		{"duplicate id", ok + ok, LoadOptions{}, `:2: field "id": duplicate id "nq/1" (first on line 1)`, ErrDuplicateID},
		{"unknown dataset", `{"question": "q", "golden_answers": ["a"], "dataset": "squad"}`, LoadOptions{},
			`:1: field "dataset": unknown dataset "squad" (known: nq, triviaqa, popqa, hotpotqa, 2wiki, musique, bamboogle)`, ErrUnknownDataset},
		{"dataset a number", `{"question": "q", "golden_answers": ["a"], "dataset": 1}`, LoadOptions{}, `:1: field "dataset": want string`, nil},
		{"names disagree", `{"question": "q", "golden_answers": ["a"], "data_source": "nq", "dataset": "popqa"}`, LoadOptions{}, `:1: field "dataset": "popqa" disagrees with data_source "nq"`, nil},
		{"no dataset name anywhere", `{"question": "q", "golden_answers": ["a"]}`, LoadOptions{}, `:1: field "data_source": missing`, nil},
		{"empty file", "\n\n", LoadOptions{}, `: no examples`, nil},
		{"endless blank lines", ok + strings.Repeat("\n", maxBlankRun+5) + ok, LoadOptions{}, `:1002: more than 1000 blank lines in a row`, nil},
		{"line over the limit", ok + `{"question": "` + strings.Repeat("x", maxLineBytes) + `"}`, LoadOptions{}, `:2: line longer than 16777216 bytes`, nil},
		{"no row of the named dataset", ok, LoadOptions{Dataset: "popqa"}, `: no examples of popqa (rows by dataset: nq: 1)`, nil},
		{"unknown dataset option", ok, LoadOptions{Dataset: "squad"}, `: unknown dataset "squad" (known: `, ErrUnknownDataset},
		{"force without dataset", ok, LoadOptions{Force: true}, `: forcing the dataset name needs a dataset`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, filepath.Join("nq", "train.jsonl"), tt.content)
			_, err := LoadFile(path, tt.opts)
			if err == nil {
				t.Fatalf("LoadFile succeeded; want error %q", tt.want)
			}
			if want := "data: " + path + tt.want; !strings.HasPrefix(err.Error(), want) {
				t.Errorf("error = %q\nwant prefix %q (file, line and field must be named)", err, want)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("error %v does not wrap %v", err, tt.is)
			}
		})
	}
}

func TestParseErrorFields(t *testing.T) {
	path := writeFile(t, "train.jsonl", `{"question": "q", "golden_answers": "a", "dataset": "nq"}`)
	_, err := LoadFile(path, LoadOptions{})
	var pe *ParseError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v is not a *ParseError; callers need errors.As", err)
	}
	if pe.File != path || pe.Line != 1 || pe.Field != "golden_answers" {
		t.Errorf("ParseError = %+v; want file %s, line 1, field golden_answers", pe, path)
	}
}

func TestLoadFileUnsupported(t *testing.T) {
	path := writeFile(t, "train.csv", "question,answer\n")
	if _, err := LoadFile(path, LoadOptions{}); err == nil || !strings.Contains(err.Error(), `unsupported file type ".csv"`) {
		t.Errorf("LoadFile(.csv) error = %v; want unsupported file type", err)
	}
	if _, err := LoadFile(filepath.Join(t.TempDir(), "missing.jsonl"), LoadOptions{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadFile(missing) error = %v; want os.ErrNotExist", err)
	}
}

// A question file that is not a regular file (a FIFO no one writes, a link
// to /dev/urandom) is refused at once, naming it.
func TestLoadFileHostileFiles(t *testing.T) {
	for _, name := range []string{"train.jsonl", "train.parquet"} {
		for _, kind := range []string{"fifo", "urandom"} {
			path := filepath.Join(t.TempDir(), "nq", name)
			os.MkdirAll(filepath.Dir(path), 0o755)
			if kind == "fifo" {
				if err := syscall.Mkfifo(path, 0o600); err != nil {
					t.Fatal(err)
				}
			} else if err := os.Symlink("/dev/urandom", path); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { _, err := LoadFile(path, LoadOptions{}); done <- err }()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "not a regular file") {
					t.Errorf("LoadFile(%s as a %s): %v; want an error naming it as not a regular file", name, kind, err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("LoadFile(%s as a %s): still blocked after 5 s", name, kind)
			}
		}
	}
}
