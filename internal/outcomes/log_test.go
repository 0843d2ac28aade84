package outcomes

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

const goodRow = `{"dataset":"nq","question_id":"nq/q1","question":"who wrote hamlet","golden_answers":["Shakespeare"],"model":"m1","reply":"Shakespeare wrote it.","correct":true}`

// Every hostile row is an error naming the file and line and saying what is
// wrong, never a panic and never a silently accepted row.
func TestReadRejectsHostileRows(t *testing.T) {
	cases := []struct{ name, line, want string }{
		{"unknown field", `{"dataset":"nq","question_id":"nq/q1","question":"q","golden_answers":["a"],"model":"m","correct":true,"extra":1}`, `unknown field "extra"`},
		{"missing model", `{"dataset":"nq","question_id":"nq/q1","question":"q","golden_answers":["a"],"correct":true}`, `field "model" is required`},
		{"null question", `{"dataset":"nq","question_id":"nq/q1","question":null,"golden_answers":["a"],"model":"m","correct":true}`, `field "question" is required`},
		{"empty dataset", `{"dataset":" ","question_id":"nq/q1","question":"q","golden_answers":["a"],"model":"m","correct":true}`, `field "dataset" is empty`},
		{"id of another dataset", `{"dataset":"nq","question_id":"hotpotqa/q1","question":"q","golden_answers":["a"],"model":"m","correct":true}`, `want "nq/<source id>"`},
		{"id without source id", `{"dataset":"nq","question_id":"nq/","question":"q","golden_answers":["a"],"model":"m","correct":true}`, `want "nq/<source id>"`},
		{"golden not a list", `{"dataset":"nq","question_id":"nq/q1","question":"q","golden_answers":"a","model":"m","correct":true}`, `field "golden_answers": got a JSON string`},
		{"golden all empty", `{"dataset":"nq","question_id":"nq/q1","question":"q","golden_answers":[""," "],"model":"m","correct":true}`, `no non-empty answer`},
		{"golden missing", `{"dataset":"nq","question_id":"nq/q1","question":"q","model":"m","correct":true}`, `"golden_answers" is required`},
		{"correct as a string", `{"dataset":"nq","question_id":"nq/q1","question":"q","golden_answers":["a"],"model":"m","correct":"true"}`, `field "correct": got a JSON string, want bool`},
		{"neither reply nor correct", `{"dataset":"nq","question_id":"nq/q1","question":"q","golden_answers":["a"],"model":"m"}`, `neither "reply" nor "correct"`},
		{"negative tokens", `{"dataset":"nq","question_id":"nq/q1","question":"q","golden_answers":["a"],"model":"m","correct":true,"input_tokens":-1}`, `field "input_tokens": -1`},
		{"fractional tokens", `{"dataset":"nq","question_id":"nq/q1","question":"q","golden_answers":["a"],"model":"m","correct":true,"output_tokens":1.5}`, `field "output_tokens"`},
		{"negative cost", `{"dataset":"nq","question_id":"nq/q1","question":"q","golden_answers":["a"],"model":"m","correct":true,"cost":-0.1}`, `field "cost"`},
		{"key given twice", `{"dataset":"nq","question_id":"nq/q1","question":"q","golden_answers":["a"],"model":"m","correct":true,"correct":false}`, `field "correct" is given twice`},
		{"not an object", `["nq"]`, `not a row`},
		{"two values on a line", goodRow + ` {}`, `more than one JSON value`},
		{"truncated", goodRow[:40], `not a row`},
		{"invalid UTF-8", "{\"dataset\":\"nq\",\"question_id\":\"nq/q1\",\"question\":\"\xff\",\"golden_answers\":[\"a\"],\"model\":\"m\",\"correct\":true}", `not valid UTF-8`},
		{"huge number", `{"dataset":"nq","question_id":"nq/q1","question":"q","golden_answers":["a"],"model":"m","correct":true,"input_tokens":1e400}`, `input_tokens`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Read(strings.NewReader(goodRow+"\n\n"+c.line+"\n"), "log.jsonl")
			if err == nil {
				t.Fatalf("read %q without error: a bad row must not be replayed", c.line)
			}
			if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "log.jsonl:3:") || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q, want ErrFormat naming log.jsonl:3 and containing %q", err, c.want)
			}
		})
	}
}

func TestReadRejectsInconsistentLogs(t *testing.T) {
	other := strings.Replace(goodRow, `"model":"m1"`, `"model":"m2"`, 1)
	cases := []struct{ name, text, want string }{
		{"duplicate (question, model)", goodRow + "\n" + goodRow + "\n", `log.jsonl:2: question "nq/q1", model "m1": duplicates line 1`},
		{"other question text", goodRow + "\n" + strings.Replace(other, "who wrote hamlet", "who wrote macbeth", 1), `log.jsonl:2: question "nq/q1": question text differs from line 1`},
		{"other golden answers", goodRow + "\n" + strings.Replace(other, `["Shakespeare"]`, `["Marlowe"]`, 1), `golden_answers differs from line 1`},
		{"empty", "\n \n", `log.jsonl: no rows`},
		{"line too long", goodRow + "\n" + strings.Repeat("x", MaxLineBytes+10), `log.jsonl:2: line longer than`},
		{"endless blank lines", goodRow + "\n" + strings.Repeat("\n", MaxBlankRun+5) + goodRow, fmt.Sprintf("log.jsonl:%d: more than %d blank lines in a row", MaxBlankRun+2, MaxBlankRun)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Read(strings.NewReader(c.text), "log.jsonl")
			if err == nil || !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want ErrFormat containing %q", err, c.want)
			}
		})
	}
}

// What Write writes, Read reads back the same, plain and gzipped.
func TestWriteReadRoundTrip(t *testing.T) {
	reply, right, in, out, cost := "It is <b>Paris</b> & more", false, 12, 5, 0.00042
	rows := []Row{
		{Dataset: "nq", QuestionID: "nq/1", Question: "capital of france", Golden: []string{"Paris"}, Model: "a", Reply: &reply, Correct: &right,
			Judge: "human", InputTokens: &in, OutputTokens: &out, Cost: &cost},
		{Dataset: "nq", QuestionID: "nq/1", Question: "capital of france", Golden: []string{"Paris"}, Model: "b", Correct: &right},
	}
	for _, name := range []string{"log.jsonl", "log.jsonl.gz"} {
		path := filepath.Join(t.TempDir(), name)
		if err := WriteFile(path, rows); err != nil {
			t.Fatal(err)
		}
		l, err := ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(l.Rows, rows) {
			t.Errorf("%s: read back %+v, want %+v", name, l.Rows, rows)
		}
		if got := l.Models(); !reflect.DeepEqual(got, []string{"a", "b"}) {
			t.Errorf("Models() = %v", got)
		}
	}
	var buf bytes.Buffer
	Write(&buf, rows[:1])
	if !strings.Contains(buf.String(), "<b>Paris</b> & more") {
		t.Errorf("reply text escaped: %s", buf.String())
	}
}

// A log that is not a regular file (a FIFO no one writes, an endless
// device) is refused at once naming it, never read or waited on.
func TestReadFileHostileFiles(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "replay.log")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{fifo, "/dev/urandom"} {
		done := make(chan error, 1)
		go func() { _, err := ReadFile(path); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "not a regular file") {
				t.Errorf("ReadFile(%s): error %v, want one naming it as not a regular file", path, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("ReadFile(%s) still running after 5 s; want an error at once", path)
		}
	}
}

func TestReadFileNotGzip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log.jsonl.gz")
	os.WriteFile(path, []byte(goodRow), 0o644)
	if _, err := ReadFile(path); err == nil || !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "not gzip") {
		t.Fatalf("error %v, want ErrFormat saying not gzip", err)
	}
}

// FuzzRead: no input makes Read panic or hang, and whatever it accepts is a
// log whose every row is looked up again by its (question, model) and
// passes the row checks.
func FuzzRead(f *testing.F) {
	f.Add([]byte(goodRow + "\n"))
	f.Add([]byte(goodRow + "\n" + goodRow))
	f.Add([]byte("{\"dataset\":\"nq\"}\n\xff\xfe"))
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := Read(bytes.NewReader(b), "fuzz.jsonl")
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v does not wrap ErrFormat", err)
			}
			return
		}
		for _, r := range l.Rows {
			got, ok := l.Lookup(r.QuestionID, r.Model)
			if !ok || !reflect.DeepEqual(got, r) {
				t.Fatalf("row %+v not found again", r)
			}
			if r.Reply == nil && r.Correct == nil {
				t.Fatalf("accepted a row with nothing to replay: %+v", r)
			}
			if !strings.HasPrefix(r.QuestionID, r.Dataset+"/") {
				t.Fatalf("accepted question id %q of dataset %q", r.QuestionID, r.Dataset)
			}
		}
	})
}
