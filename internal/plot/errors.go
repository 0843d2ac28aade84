package plot

import (
	"errors"
	"fmt"
)

var (
	// ErrNoRecords reports a metrics file with no complete record: empty,
	// blank, or holding only a truncated line.
	ErrNoRecords = errors.New("no records")
)

// LineError reports a line of a JSONL file that is not a valid record. Only
// the last line of a file may be malformed (it is then skipped); any other
// malformed line is a LineError.
type LineError struct {
	Path string // the file
	Line int    // 1-based line number
	Err  error  // what the JSON decoder said
}

func (e *LineError) Error() string {
	return fmt.Sprintf("plot: %s: line %d: %v", e.Path, e.Line, e.Err)
}

func (e *LineError) Unwrap() error { return e.Err }
