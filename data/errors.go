package data

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. They carry no package prefix because they are wrapped:
// the errors returned to callers read "data: …" and match with errors.Is.
var (
	// ErrUnknownDataset is wrapped by every error about a dataset name that is
	// not in the registry; the message lists the known names.
	ErrUnknownDataset = errors.New("unknown dataset")
	// ErrUnknownSplit is wrapped by every error about a split name other than
	// "id", "ood" and "all".
	ErrUnknownSplit = errors.New("unknown split")
	// ErrDuplicateID is wrapped by errors about two examples with the same
	// global id in one file.
	ErrDuplicateID = errors.New("duplicate id")
	// ErrNoGolden is wrapped by errors about an example whose golden answers
	// are all empty.
	ErrNoGolden = errors.New("no non-empty golden answer")
	// ErrStateMismatch is wrapped by Sampler.Restore's errors about a state
	// saved for another seed or training set.
	ErrStateMismatch = errors.New("sampler state does not match")
)

// ParseError reports a bad record of a data file. Callers can get the details
// with errors.As.
type ParseError struct {
	File  string // path of the file, as given to the loader
	Line  int    // 1-based line (JSON Lines) or row (Parquet); 0 when the error concerns the whole file
	Field string // field name, dotted for nested fields; "" when the record as a whole is bad
	Err   error  // what is wrong
}

func (e *ParseError) Error() string {
	var b strings.Builder
	b.WriteString("data: ")
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	if e.Field != "" {
		fmt.Fprintf(&b, ": field %q", e.Field)
	}
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *ParseError) Unwrap() error { return e.Err }
