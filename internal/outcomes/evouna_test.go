package outcomes

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// The converter's counts on a hand-written fixture in EVOUNA's format, whose
// every count is worked out by hand in the comments.
func TestConvertEVOUNACountsFixture(t *testing.T) {
	out := t.TempDir()
	rep, err := ConvertEVOUNA("testdata/evouna", out, EVOUNAOptions{Test: 1})
	if err != nil {
		t.Fatal(err)
	}
	want := EVOUNAReport{Datasets: []DatasetReport{{
		Dataset: "nq", File: "NQ.json", Records: 6, Improper: 1, NoGolden: 1,
		// record 1 has no gpt35 judgment, record 4 no newbing one
		Usable: map[string]int{"fid": 4, "gpt35": 3, "chatgpt": 4, "gpt4": 4, "newbing": 3},
		Right:  map[string]int{"fid": 4, "gpt35": 2, "chatgpt": 3, "gpt4": 4, "newbing": 3},
		// records 0 and 5; rows: 5+5+5 (improper kept)+0 (no golden)+4 (newbing has neither)+5
		Complete: 2, Rows: 24, Train: 1, Test: 1,
	}, {
		Dataset: "triviaqa", File: "TQ.json", Records: 2,
		Usable:   map[string]int{"fid": 1, "gpt35": 1, "chatgpt": 1, "gpt4": 1, "newbing": 1},
		Right:    map[string]int{"fid": 1, "gpt35": 1, "chatgpt": 1, "gpt4": 1, "newbing": 1},
		Complete: 1, Rows: 10, Test: 1, // judgments "nan" are missing: record 1 is not complete
	}}}
	if !reflect.DeepEqual(rep, want) {
		t.Fatalf("report\n%+v\nwant\n%+v", rep, want)
	}
	l, err := ReadFile(filepath.Join(out, LogFile))
	if err != nil {
		t.Fatalf("the converter's own log does not read back: %v", err)
	}
	if len(l.Rows) != 34 {
		t.Errorf("%d rows in the log, want 24 + 10", len(l.Rows))
	}
	row, ok := l.Lookup("nq/evouna-0", "newbing")
	if !ok || row.Reply != nil || row.Correct == nil || !*row.Correct || row.Judge != EVOUNAJudge {
		t.Errorf("nq/evouna-0 newbing = %+v, %v; want a judged-right row without reply text", row, ok)
	}
	if row, _ := l.Lookup("nq/evouna-0", "fid"); !reflect.DeepEqual(row.Golden, []string{"William Shakespeare", "Shakespeare"}) {
		t.Errorf("golden answers %q, want the '/'-separated alternatives", row.Golden)
	}
	if _, ok := l.Lookup("nq/evouna-4", "newbing"); ok {
		t.Error("a record without reply and judgment made a row: there is nothing to replay")
	}
	if row, _ := l.Lookup("triviaqa/evouna-1", "fid"); row.Correct != nil {
		t.Errorf("judgment \"nan\" became %v, want none", *row.Correct)
	}
	for file, n := range map[string]int{"nq/train.jsonl": 1, "nq/test.jsonl": 1, "triviaqa/test.jsonl": 1} {
		if got := countLines(t, filepath.Join(out, file)); got != n {
			t.Errorf("%s: %d questions, want %d", file, got, n)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "triviaqa/train.jsonl")); err == nil {
		t.Error("the out-of-domain dataset got a training file")
	}
	for _, f := range []string{"LICENSE", "README.md", ReportFile} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("%s not written: %v", f, err)
		}
	}
}

func TestConvertEVOUNAHostileSource(t *testing.T) {
	cases := []struct{ name, nq, want string }{
		{"not an array", `{"question": "x"}`, "want a JSON array"},
		{"unknown field", `[{"question": "q", "golden_answer": "a", "answer_gpt5": "x"}]`, `record 0: unknown field "answer_gpt5"`},
		{"judgment of another type", `[{"question": "q", "golden_answer": "a", "judge_fid": "yes"}]`, `field "judge_fid"`},
		{"no question", `[{"golden_answer": "a"}]`, `field "question" is missing`},
		{"answer not a string", `[{"question": "q", "golden_answer": "a", "answer_fid": 3}]`, `field "answer_fid": want a string or null`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := t.TempDir()
			os.WriteFile(filepath.Join(src, "NQ.json"), []byte(c.nq), 0o644)
			_, err := ConvertEVOUNA(src, t.TempDir(), EVOUNAOptions{})
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "NQ.json") {
				t.Fatalf("error %v, want one naming NQ.json and containing %q", err, c.want)
			}
		})
	}
}

// The vendored conversion (data/outcomes/evouna) is consistent: its log has
// the rows its report counts, its question files hold the questions it
// counts, and every question of those files has a judged row of every
// system, which the replay config relies on.
func TestVendoredEVOUNA(t *testing.T) {
	dir := filepath.Join("..", "..", "data", "outcomes", "evouna")
	b, err := os.ReadFile(filepath.Join(dir, ReportFile))
	if err != nil {
		t.Fatal(err)
	}
	var rep EVOUNAReport
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	l, err := ReadFile(filepath.Join(dir, LogFile))
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]int{}
	for _, r := range l.Rows {
		rows[r.Dataset]++
	}
	records := map[string]int{"nq": 3610, "triviaqa": 2000} // EVOUNA's NQ.json and TQ.json
	for _, d := range rep.Datasets {
		if d.Records != records[d.Dataset] {
			t.Errorf("%s: %d records, EVOUNA's file has %d", d.Dataset, d.Records, records[d.Dataset])
		}
		if rows[d.Dataset] != d.Rows {
			t.Errorf("%s: %d rows in the log, the report says %d", d.Dataset, rows[d.Dataset], d.Rows)
		}
		n := 0
		for _, split := range []string{"train", "test"} {
			path := filepath.Join(dir, d.Dataset, split+".jsonl")
			if _, err := os.Stat(path); err != nil {
				continue
			}
			for _, q := range readQuestions(t, path) {
				n++
				for _, s := range EVOUNASystems {
					if r, ok := l.Lookup(d.Dataset+"/"+q.ID, s); !ok || r.Correct == nil {
						t.Fatalf("%s: question %s has no judged row of %s", path, q.ID, s)
					}
				}
			}
		}
		if n != d.Complete || n != d.Train+d.Test {
			t.Errorf("%s: %d questions in the question files, the report counts %d complete, %d + %d", d.Dataset, n, d.Complete, d.Train, d.Test)
		}
	}
}

// With EVOUNA's files at hand (RECAL_EVOUNA_DIR), converting them again
// gives exactly the vendored folder.
func TestConvertEVOUNAReproducesVendored(t *testing.T) {
	src := os.Getenv("RECAL_EVOUNA_DIR")
	if src == "" {
		t.Skip("RECAL_EVOUNA_DIR is not set: EVOUNA's NQ.json and TQ.json are not vendored, only their conversion")
	}
	out := t.TempDir()
	if _, err := ConvertEVOUNA(src, out, EVOUNAOptions{}); err != nil {
		t.Fatal(err)
	}
	vend := filepath.Join("..", "..", "data", "outcomes", "evouna")
	for _, f := range []string{ReportFile, "README.md", "LICENSE", "nq/train.jsonl", "nq/test.jsonl", "triviaqa/test.jsonl"} {
		a, _ := os.ReadFile(filepath.Join(out, f))
		b, _ := os.ReadFile(filepath.Join(vend, f))
		if string(a) != string(b) || len(a) == 0 {
			t.Errorf("%s differs from the vendored one", f)
		}
	}
	a, err := ReadFile(filepath.Join(out, LogFile))
	if err != nil {
		t.Fatal(err)
	}
	b, err := ReadFile(filepath.Join(vend, LogFile))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a.Rows, b.Rows) {
		t.Error("the log's rows differ from the vendored log's")
	}
}

func countLines(t *testing.T, path string) int {
	t.Helper()
	return len(readQuestions(t, path))
}

func readQuestions(t *testing.T, path string) []question {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []question
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var q question
		if err := json.Unmarshal(sc.Bytes(), &q); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, q)
	}
	return out
}
