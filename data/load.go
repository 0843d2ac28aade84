package data

import (
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// LoadOptions say which dataset a file holds.
type LoadOptions struct {
	// Dataset is the dataset the file was named for ("" for none). Rows
	// without a data_source or dataset field get this name. Rows whose field
	// names a different known dataset are skipped, so one merged file (such as
	// Router-R1's train_nh_qwen.parquet, which mixes nq and hotpotqa) can be
	// named for each of its datasets.
	Dataset string
	// Force labels every row Dataset and ignores the rows' data_source and
	// dataset fields. It needs Dataset.
	Force bool
}

// Field names read from data files. Everything else is ignored.
const (
	fieldID         = "id"
	fieldQuestion   = "question"
	fieldGolden     = "golden_answers"
	fieldTarget     = "reward_model.ground_truth.target"
	fieldDataSource = "data_source"
	fieldDataset    = "dataset"
)

// record is one row as a reader found it. A nil pointer or nil slice means
// the field is absent or null.
type record struct {
	line       int // 1-based line (JSONL) or row (Parquet)
	id         *string
	question   *string
	golden     []string // non-null elements of golden_answers
	target     []string // non-null elements of reward_model.ground_truth.target
	dataSource *string
	dataset    *string
}

// LoadFile reads the QA examples of one file, JSON Lines (.jsonl, .json) or
// Parquet (.parquet), as FlashRAG, Search-R1 and Router-R1 publish them.
//
// Fields read:
//   - question: string, required.
//   - golden_answers: list of strings. When it is absent, null or empty, the
//     list under reward_model.ground_truth.target (Search-R1, Router-R1) is used.
//   - id: string or integer; when absent, the 0-based row index.
//   - data_source or dataset: the dataset name (aliases such as
//     "2wikimultihopqa" are accepted); see LoadOptions.
//
// Other fields (prompt, metadata, extra_info, ...) are ignored. Every bad
// record is an error naming the file, line (or row) and field; see
// ParseError. Two rows with the same global id give an error wrapping
// ErrDuplicateID. A file that yields no example is an error too.
func LoadFile(path string, opts LoadOptions) ([]Example, error) {
	if opts.Dataset != "" {
		ds, err := canonical(opts.Dataset)
		if err != nil {
			return nil, fmt.Errorf("data: %s: %w", path, err)
		}
		opts.Dataset = ds
	} else if opts.Force {
		return nil, fmt.Errorf("data: %s: forcing the dataset name needs a dataset", path)
	}
	b := &builder{path: path, opts: opts, seen: make(map[string]int), skipped: make(map[string]int)}
	var err error
	switch ext := strings.ToLower(filepath.Ext(path)); ext {
	case ".jsonl", ".json":
		err = readJSONL(path, b.add)
	case ".parquet":
		err = readParquet(path, b.add)
	default:
		return nil, fmt.Errorf("data: %s: unsupported file type %q (want .jsonl, .json or .parquet)", path, ext)
	}
	if err != nil {
		return nil, err
	}
	if len(b.out) == 0 {
		return nil, b.emptyError()
	}
	return b.out, nil
}

// builder turns records into examples.
type builder struct {
	path    string
	opts    LoadOptions
	index   int            // 0-based index of the next record
	out     []Example      // examples kept so far
	seen    map[string]int // global id → line
	skipped map[string]int // dataset → rows skipped as belonging to it
}

func (b *builder) fail(line int, field string, err error) error {
	return &ParseError{File: b.path, Line: line, Field: field, Err: err}
}

// add turns one record into an example, or skips it, or fails.
func (b *builder) add(r record) error {
	index := b.index
	b.index++

	ds, err := b.datasetOf(r)
	if err != nil {
		return err
	}
	if b.opts.Dataset != "" && ds != b.opts.Dataset {
		b.skipped[ds]++ // a merged file's row of another dataset
		return nil
	}

	if r.question == nil {
		return b.fail(r.line, fieldQuestion, errors.New("missing"))
	}
	golden, goldenField := r.golden, fieldGolden
	if len(golden) == 0 && len(r.target) > 0 {
		golden, goldenField = r.target, fieldTarget
	}
	if len(golden) == 0 {
		return b.fail(r.line, fieldGolden, fmt.Errorf("missing (and no %s)", fieldTarget))
	}
	id := strconv.Itoa(index)
	if r.id != nil {
		id = *r.id
	}
	ex, field, err := newExample(rawExample{sourceID: id, dataset: ds, question: *r.question, golden: golden})
	if err != nil {
		if field == fieldGolden {
			field = goldenField
		}
		return b.fail(r.line, field, err)
	}
	if prev, dup := b.seen[ex.ID]; dup {
		return b.fail(r.line, fieldID, fmt.Errorf("%w %q (first on line %d)", ErrDuplicateID, ex.ID, prev))
	}
	b.seen[ex.ID] = r.line
	b.out = append(b.out, ex)
	return nil
}

// datasetOf resolves the dataset of a record.
func (b *builder) datasetOf(r record) (string, error) {
	if b.opts.Force {
		return b.opts.Dataset, nil
	}
	var ds, from string
	for _, f := range []struct {
		name  string
		value *string
	}{{fieldDataSource, r.dataSource}, {fieldDataset, r.dataset}} {
		if f.value == nil {
			continue
		}
		canon, err := canonical(*f.value)
		if err != nil {
			return "", b.fail(r.line, f.name, err)
		}
		if ds != "" && canon != ds {
			return "", b.fail(r.line, f.name, fmt.Errorf("%q disagrees with %s %q", *f.value, from, ds))
		}
		ds, from = canon, f.name
	}
	if ds != "" {
		return ds, nil
	}
	if b.opts.Dataset != "" {
		return b.opts.Dataset, nil
	}
	return "", b.fail(r.line, fieldDataSource, errors.New(`missing: want "data_source" or "dataset", or name the file's dataset`))
}

func (b *builder) emptyError() error {
	if len(b.skipped) == 0 {
		return fmt.Errorf("data: %s: no examples", b.path)
	}
	var parts []string
	for ds, n := range b.skipped {
		parts = append(parts, fmt.Sprintf("%s: %d", ds, n))
	}
	sort.Strings(parts)
	return fmt.Errorf("data: %s: no examples of %s (rows by dataset: %s)", b.path, b.opts.Dataset, strings.Join(parts, ", "))
}
