package outcomes

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/recal-project/recal/internal/inputfile"
)

// MaxLineBytes bounds one line of an outcome log, so a hostile file cannot
// make the reader hold an unbounded line.
const MaxLineBytes = 1 << 20

// MaxBlankRun bounds the blank lines in a row of an outcome log: a log of
// hundreds of megabytes of blank lines (cheap to send gzipped) is refused
// at its first such run, not read for half a minute and accepted.
const MaxBlankRun = 1000

// Row is one line of an outcome log: what one model said to one question.
// The field names are the JSON keys; docs/outcomes.md documents them.
type Row struct {
	// Dataset is the dataset's name as package data knows it ("nq",
	// "triviaqa"). Required.
	Dataset string `json:"dataset"`
	// QuestionID is the question's id as package data gives it,
	// "<dataset>/<source id>" (data.Example.ID): the key a replayed pool
	// call is answered by. Required.
	QuestionID string `json:"question_id"`
	// Question is the question's text. Required.
	Question string `json:"question"`
	// Golden are the golden answers; at least one non-empty. Required.
	Golden []string `json:"golden_answers"`
	// Model is the name of the model in the log (not necessarily a pool
	// name: replay.model maps one to the other). Required.
	Model string `json:"model"`
	// Reply is the model's reply text; nil when not logged.
	Reply *string `json:"reply,omitempty"`
	// Correct is the judgment of Reply (true: right); nil when not judged.
	// A row needs Reply or Correct.
	Correct *bool `json:"correct,omitempty"`
	// Judge says who judged Correct (free text, e.g. "human (EVOUNA)",
	// "exact match"); "" when unknown.
	Judge string `json:"judge,omitempty"`
	// InputTokens and OutputTokens are the call's prompt and completion
	// tokens; nil when not logged.
	InputTokens  *int `json:"input_tokens,omitempty"`
	OutputTokens *int `json:"output_tokens,omitempty"`
	// Cost is what the call cost, in USD; nil when not logged.
	Cost *float64 `json:"cost,omitempty"`
	// LatencyMS is the call's wall time in milliseconds; nil when not
	// logged.
	LatencyMS *float64 `json:"latency_ms,omitempty"`
}

// Log is an outcome log read whole: its rows in file order and an index by
// (question id, model).
type Log struct {
	// Name is the file name the log was read from (for errors).
	Name  string
	Rows  []Row
	index map[key]int
}

type key struct{ question, model string }

// Lookup returns the row of (question id, model).
func (l *Log) Lookup(questionID, model string) (Row, bool) {
	i, ok := l.index[key{questionID, model}]
	if !ok {
		return Row{}, false
	}
	return l.Rows[i], true
}

// Models returns the models of the log, sorted.
func (l *Log) Models() []string {
	seen := map[string]bool{}
	for _, r := range l.Rows {
		seen[r.Model] = true
	}
	out := make([]string, 0, len(seen))
	for m := range seen {
		out = append(out, m)
	}
	slices.Sort(out)
	return out
}

// Questions returns the question ids of the log in the order they first
// appear.
func (l *Log) Questions() []string {
	seen := map[string]bool{}
	var out []string
	for _, r := range l.Rows {
		if !seen[r.QuestionID] {
			seen[r.QuestionID] = true
			out = append(out, r.QuestionID)
		}
	}
	return out
}

// ErrFormat is wrapped by every error about the content of a log (not I/O).
var ErrFormat = errors.New("outcomes: bad outcome log")

// ReadFile reads the outcome log at path (see Read); a path ending in
// ".gz" is gunzipped first.
func ReadFile(path string) (*Log, error) {
	f, err := inputfile.Open(path)
	if err != nil {
		return nil, fmt.Errorf("outcomes: %w", err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: not gzip: %v", ErrFormat, path, err)
		}
		defer zr.Close()
		r = zr
	}
	l, err := Read(r, path)
	if err != nil && !errors.Is(err, ErrFormat) && strings.HasSuffix(path, ".gz") {
		return nil, fmt.Errorf("%w: %v", ErrFormat, err) // a corrupt gzip stream
	}
	return l, err
}

// Read reads an outcome log, strictly: every non-blank line must be one JSON
// object with only the fields of Row, of the right types, with every
// required field present and valid, and at most one row per (question id,
// model); rows of one question id must agree on its dataset, text and golden
// answers. The first problem is an error wrapping ErrFormat that names the
// file (name) and line. An empty log is an error too.
func Read(r io.Reader, name string) (*Log, error) {
	l := &Log{Name: name, index: map[key]int{}}
	lines := map[key]int{}        // line of each (question, model)
	firstLine := map[string]int{} // line of each question's first row
	firstRow := map[string]int{}  // index in l.Rows of each question's first row
	br := bufio.NewReaderSize(r, 64<<10)
	blank := 0 // blank lines in a row
	for n := 1; ; n++ {
		line, err := readLine(br)
		if err != nil && !errors.Is(err, io.EOF) {
			if errors.Is(err, errLongLine) {
				return nil, fmt.Errorf("%w: %s:%d: line longer than %d bytes", ErrFormat, name, n, MaxLineBytes)
			}
			return nil, fmt.Errorf("outcomes: %s:%d: %w", name, n, err)
		}
		if len(bytes.TrimSpace(line)) == 0 && !errors.Is(err, io.EOF) {
			if blank++; blank > MaxBlankRun {
				return nil, fmt.Errorf("%w: %s:%d: more than %d blank lines in a row", ErrFormat, name, n, MaxBlankRun)
			}
		} else {
			blank = 0
		}
		if len(bytes.TrimSpace(line)) > 0 {
			row, perr := parseRow(line)
			if perr != nil {
				return nil, fmt.Errorf("%w: %s:%d: %v", ErrFormat, name, n, perr)
			}
			k := key{row.QuestionID, row.Model}
			if prev, dup := lines[k]; dup {
				return nil, fmt.Errorf("%w: %s:%d: question %q, model %q: duplicates line %d", ErrFormat, name, n, cut(row.QuestionID), cut(row.Model), prev)
			}
			if fl, ok := firstLine[row.QuestionID]; ok {
				if msg := disagree(l.Rows[firstRow[row.QuestionID]], row); msg != "" {
					return nil, fmt.Errorf("%w: %s:%d: question %q: %s differs from line %d", ErrFormat, name, n, cut(row.QuestionID), msg, fl)
				}
			} else {
				firstLine[row.QuestionID] = n
				firstRow[row.QuestionID] = len(l.Rows)
			}
			lines[k] = n
			l.index[k] = len(l.Rows)
			l.Rows = append(l.Rows, row)
		}
		if errors.Is(err, io.EOF) {
			break
		}
	}
	if len(l.Rows) == 0 {
		return nil, fmt.Errorf("%w: %s: no rows", ErrFormat, name)
	}
	return l, nil
}

var errLongLine = errors.New("line too long")

// readLine reads one line without its newline, at most MaxLineBytes long.
func readLine(br *bufio.Reader) ([]byte, error) {
	var out []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(out)+len(chunk) > MaxLineBytes+1 {
			return nil, errLongLine
		}
		out = append(out, chunk...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return bytes.TrimSuffix(out, []byte("\n")), err
	}
}

// rawRow has a pointer per field, so that a missing field and a null are
// told apart from a zero value.
type rawRow struct {
	Dataset      *string   `json:"dataset"`
	QuestionID   *string   `json:"question_id"`
	Question     *string   `json:"question"`
	Golden       *[]string `json:"golden_answers"`
	Model        *string   `json:"model"`
	Reply        *string   `json:"reply"`
	Correct      *bool     `json:"correct"`
	Judge        *string   `json:"judge"`
	InputTokens  *int      `json:"input_tokens"`
	OutputTokens *int      `json:"output_tokens"`
	Cost         *float64  `json:"cost"`
	LatencyMS    *float64  `json:"latency_ms"`
}

// parseRow decodes and checks one line. Its errors are messages for Read.
func parseRow(line []byte) (Row, error) {
	if !utf8.Valid(line) {
		return Row{}, errors.New("not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	var raw rawRow
	if err := dec.Decode(&raw); err != nil {
		return Row{}, fmt.Errorf("not a row: %v", jsonMessage(err))
	}
	if dec.More() {
		return Row{}, errors.New("more than one JSON value on the line")
	}
	if err := checkDuplicateKeys(line); err != nil {
		return Row{}, err
	}
	req := []struct {
		name string
		v    *string
	}{{"dataset", raw.Dataset}, {"question_id", raw.QuestionID}, {"question", raw.Question}, {"model", raw.Model}}
	for _, f := range req {
		if f.v == nil {
			return Row{}, fmt.Errorf("field %q is required", f.name)
		}
		if strings.TrimSpace(*f.v) == "" {
			return Row{}, fmt.Errorf("field %q is empty", f.name)
		}
	}
	row := Row{Dataset: *raw.Dataset, QuestionID: *raw.QuestionID, Question: *raw.Question, Model: *raw.Model,
		Reply: raw.Reply, Correct: raw.Correct, InputTokens: raw.InputTokens, OutputTokens: raw.OutputTokens, Cost: raw.Cost, LatencyMS: raw.LatencyMS}
	if raw.Judge != nil {
		row.Judge = *raw.Judge
	}
	if !strings.HasPrefix(row.QuestionID, row.Dataset+"/") || len(row.QuestionID) == len(row.Dataset)+1 {
		return Row{}, fmt.Errorf("question_id %q: want \"%s/<source id>\" (the id package data gives a question of dataset %q)", cut(row.QuestionID), row.Dataset, row.Dataset)
	}
	if raw.Golden == nil {
		return Row{}, errors.New(`field "golden_answers" is required`)
	}
	row.Golden = *raw.Golden
	nonEmpty := false
	for _, g := range row.Golden {
		nonEmpty = nonEmpty || strings.TrimSpace(g) != ""
	}
	if !nonEmpty {
		return Row{}, errors.New(`field "golden_answers" has no non-empty answer`)
	}
	if row.Reply == nil && row.Correct == nil {
		return Row{}, errors.New(`the row has neither "reply" nor "correct": nothing to replay`)
	}
	for _, f := range []struct {
		name string
		v    *int
	}{{"input_tokens", row.InputTokens}, {"output_tokens", row.OutputTokens}} {
		if f.v != nil && *f.v < 0 {
			return Row{}, fmt.Errorf("field %q: %d, want >= 0", f.name, *f.v)
		}
	}
	if row.Cost != nil && (*row.Cost < 0 || math.IsInf(*row.Cost, 0) || math.IsNaN(*row.Cost)) {
		return Row{}, fmt.Errorf(`field "cost": %v, want a finite cost >= 0 (USD)`, *row.Cost)
	}
	if row.LatencyMS != nil && !(*row.LatencyMS >= 0 && *row.LatencyMS < 1e12) {
		return Row{}, fmt.Errorf(`field "latency_ms": %v, want >= 0 (milliseconds)`, *row.LatencyMS)
	}
	return row, nil
}

// checkDuplicateKeys rejects an object that gives a key twice (encoding/json
// would keep the last silently).
func checkDuplicateKeys(line []byte) error {
	dec := json.NewDecoder(bytes.NewReader(line))
	if _, err := dec.Token(); err != nil { // '{'
		return err
	}
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		k, _ := t.(string)
		if seen[k] {
			return fmt.Errorf("field %q is given twice", k)
		}
		seen[k] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return err
		}
	}
	return nil
}

// jsonMessage shortens encoding/json's errors to what a user needs.
func jsonMessage(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("field %q: got a JSON %s, want %s", te.Field, te.Value, te.Type)
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

// disagree names the first of dataset, question and golden answers on which
// two rows of one question differ, or "".
func disagree(a, b Row) string {
	switch {
	case a.Dataset != b.Dataset:
		return "dataset"
	case a.Question != b.Question:
		return "question text"
	case !slices.Equal(a.Golden, b.Golden):
		return "golden_answers"
	}
	return ""
}

// cut shortens untrusted text for an error message.
func cut(s string) string {
	if utf8.RuneCountInString(s) <= 80 {
		return s
	}
	r := []rune(s)
	return string(r[:80]) + "…"
}

// Write writes rows as an outcome log, one JSON object per line, in the
// order given. It does not check them: Read does.
func Write(w io.Writer, rows []Row) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	for i := range rows {
		if err := enc.Encode(&rows[i]); err != nil {
			return fmt.Errorf("outcomes: write row %d: %w", i, err)
		}
	}
	return bw.Flush()
}

// WriteFile writes rows as an outcome log at path, replacing it whole (a
// temporary file renamed into place); a path ending in ".gz" is gzipped.
func WriteFile(path string, rows []Row) error {
	return writeFile(path, func(w io.Writer) error {
		if !strings.HasSuffix(path, ".gz") {
			return Write(w, rows)
		}
		zw, err := gzip.NewWriterLevel(w, gzip.BestCompression)
		if err != nil {
			return err
		}
		if err := Write(zw, rows); err != nil {
			return err
		}
		return zw.Close()
	})
}
