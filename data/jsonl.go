package data

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/recal-project/recal/internal/inputfile"
)

// maxLineBytes bounds one JSON Lines record. FlashRAG's longest rows (with
// metadata) are a few KiB.
const maxLineBytes = 16 << 20

// maxBlankRun bounds the blank lines in a row: a file of endless blank
// lines is refused at the first such run, not read to its end.
const maxBlankRun = 1000

var errWantStringList = errors.New("want list of strings")

// readJSONL reads path as JSON Lines and passes each record to add. Blank
// lines are skipped; a UTF-8 byte order mark at the start is allowed.
func readJSONL(path string, add func(record) error) error {
	f, err := inputfile.Open(path)
	if err != nil {
		return fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	return scanJSONL(path, f, add)
}

func scanJSONL(path string, r io.Reader, add func(record) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	fail := func(line int, field string, err error) error {
		return &ParseError{File: path, Line: line, Field: field, Err: err}
	}
	blank := 0 // blank lines in a row
	for line := 1; ; line++ {
		text, err := readLine(br)
		if err != nil && err != io.EOF {
			return fail(line, "", err)
		}
		if len(bytes.TrimSpace(text)) == 0 && err == nil {
			if blank++; blank > maxBlankRun {
				return fail(line, "", fmt.Errorf("more than %d blank lines in a row", maxBlankRun))
			}
		} else {
			blank = 0
		}
		if line == 1 {
			text = bytes.TrimPrefix(text, []byte("\xef\xbb\xbf"))
		}
		if text = bytes.TrimSpace(text); len(text) > 0 {
			rec, field, perr := parseJSONRecord(text)
			if perr != nil {
				return fail(line, field, perr)
			}
			rec.line = line
			if aerr := add(rec); aerr != nil {
				return aerr
			}
		}
		if err == io.EOF {
			return nil
		}
	}
}

// readLine returns the next line without its newline, or io.EOF with the
// last (possibly empty) line.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line)+len(chunk) > maxLineBytes {
			return nil, fmt.Errorf("line longer than %d bytes", maxLineBytes)
		}
		line = append(line, chunk...)
		switch {
		case err == nil:
			return line[:len(line)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return line, err
		}
	}
}

// parseJSONRecord decodes the fields we use from one JSON object. On error
// it also returns the offending field ("" for the whole line).
func parseJSONRecord(text []byte) (record, string, error) {
	var rec record
	if text[0] != '{' {
		return rec, "", errors.New("want a JSON object")
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(text, &obj); err != nil {
		return rec, "", fmt.Errorf("malformed JSON: %v", err)
	}
	var err error
	if rec.id, err = jsonID(obj[fieldID]); err != nil {
		return rec, fieldID, err
	}
	if rec.question, err = jsonString(obj[fieldQuestion]); err != nil {
		return rec, fieldQuestion, err
	}
	if rec.golden, err = jsonStringList(obj[fieldGolden]); err != nil {
		return rec, fieldGolden, err
	}
	if len(rec.golden) == 0 {
		// Only consulted when golden_answers is missing or empty.
		var field string
		if rec.target, field, err = jsonTarget(obj["reward_model"]); err != nil {
			return rec, field, err
		}
	}
	if rec.dataSource, err = jsonString(obj[fieldDataSource]); err != nil {
		return rec, fieldDataSource, err
	}
	if rec.dataset, err = jsonString(obj[fieldDataset]); err != nil {
		return rec, fieldDataset, err
	}
	return rec, "", nil
}

func isNull(raw json.RawMessage) bool {
	return raw == nil || string(raw) == "null"
}

// jsonString decodes a string field; nil when absent or null.
func jsonString(raw json.RawMessage) (*string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var s string
	if raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return nil, errors.New("want string")
	}
	return &s, nil
}

// jsonID decodes an id: a string, or an integer kept as written.
func jsonID(raw json.RawMessage) (*string, error) {
	if isNull(raw) {
		return nil, nil
	}
	if raw[0] == '"' {
		return jsonString(raw)
	}
	digits := bytes.TrimPrefix(raw, []byte("-"))
	if len(digits) == 0 || bytes.IndexFunc(digits, func(r rune) bool { return r < '0' || r > '9' }) >= 0 {
		return nil, errors.New("want string or integer")
	}
	s := string(raw)
	return &s, nil
}

// jsonStringList decodes a list of strings; null elements are dropped, a
// null or absent list is nil.
func jsonStringList(raw json.RawMessage) ([]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var items []*string
	if raw[0] != '[' || json.Unmarshal(raw, &items) != nil {
		return nil, errWantStringList
	}
	out := make([]string, 0, len(items))
	for _, s := range items {
		if s != nil {
			out = append(out, *s)
		}
	}
	return out, nil
}

// jsonTarget digs reward_model.ground_truth.target out of a Search-R1 row.
func jsonTarget(raw json.RawMessage) ([]string, string, error) {
	path := []string{"reward_model", "ground_truth", "target"}
	for i, name := range path[1:] {
		if isNull(raw) {
			return nil, "", nil
		}
		var obj map[string]json.RawMessage
		if raw[0] != '{' || json.Unmarshal(raw, &obj) != nil {
			return nil, strings.Join(path[:i+1], "."), errors.New("want object")
		}
		raw = obj[name]
	}
	list, err := jsonStringList(raw)
	if err != nil {
		return nil, fieldTarget, err
	}
	return list, "", nil
}
