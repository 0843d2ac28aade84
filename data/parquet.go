package data

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/format"

	"github.com/recal-project/recal/internal/inputfile"
)

// Column roles of a Parquet file, one per field we read.
const (
	roleNone = iota
	roleID
	roleQuestion
	roleGolden
	roleTarget
	roleDataSource
	roleDataset
)

// parquetPlan maps leaf column indexes to the fields we read.
type parquetPlan struct {
	roles []int // by leaf column index
}

// readParquet reads path as Parquet and passes each row to add.
//
// The file's schema is checked first. Scalar fields must be string columns
// (id may also be an integer). golden_answers and
// reward_model.ground_truth.target must be list<string> in the standard
// 3-level LIST layout, with the element named "element" (pyarrow, Hugging
// Face datasets) or "item" (older parquet-cpp); any other layout is an
// error naming the column, because a reader bound to the wrong name silently
// yields empty strings.
func readParquet(path string, add func(record) error) (err error) {
	f, err := inputfile.Open(path)
	if err != nil {
		return fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("data: %w", err)
	}
	// parquet-go may panic on a corrupt file; report it as this file's error.
	defer func() {
		if r := recover(); r != nil {
			err = &ParseError{File: path, Err: fmt.Errorf("parquet reader failed: %v", r)}
		}
	}()
	pf, err := parquet.OpenFile(f, st.Size(), parquet.SkipBloomFilters(true), parquet.SkipPageIndex(true))
	if err != nil {
		return &ParseError{File: path, Err: fmt.Errorf("not a readable parquet file: %w", err)}
	}
	plan, err := planParquet(path, pf.Schema())
	if err != nil {
		return err
	}
	row := 0 // rows read so far, across row groups
	for _, rg := range pf.RowGroups() {
		if err := plan.readRowGroup(path, rg, &row, add); err != nil {
			return err
		}
	}
	return nil
}

// readRowGroup passes the rows of one row group to add, counting them in
// *row.
func (p *parquetPlan) readRowGroup(path string, rg parquet.RowGroup, row *int, add func(record) error) error {
	rows := rg.Rows()
	defer rows.Close()
	buf := make([]parquet.Row, 256)
	for {
		n, err := rows.ReadRows(buf)
		for _, r := range buf[:n] {
			*row++
			rec, field, ferr := p.record(r)
			if ferr != nil {
				return &ParseError{File: path, Line: *row, Field: field, Err: ferr}
			}
			rec.line = *row
			if aerr := add(rec); aerr != nil {
				return aerr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return &ParseError{File: path, Line: *row + 1, Err: err}
		}
	}
}

// planParquet checks the schema of the file at path and finds the leaf
// columns of our fields.
func planParquet(path string, schema *parquet.Schema) (*parquetPlan, error) {
	plan := &parquetPlan{roles: make([]int, len(schema.Columns()))}
	set := func(path []string, role int) {
		if leaf, ok := schema.Lookup(path...); ok {
			plan.roles[leaf.ColumnIndex] = role
		}
	}
	for _, s := range []struct {
		name  string
		role  int
		check func(parquet.Node) error
	}{
		{fieldID, roleID, checkID},
		{fieldQuestion, roleQuestion, checkString},
		{fieldDataSource, roleDataSource, checkString},
		{fieldDataset, roleDataset, checkString},
	} {
		node := child(schema, s.name)
		if node == nil {
			continue
		}
		if err := s.check(node); err != nil {
			return nil, &ParseError{File: path, Field: s.name, Err: fmt.Errorf("%w, got %s", err, describe(node))}
		}
		set([]string{s.name}, s.role)
	}

	golden := child(schema, fieldGolden)
	if golden != nil {
		elem, err := checkStringList(golden)
		if err != nil {
			return nil, &ParseError{File: path, Field: fieldGolden, Err: err}
		}
		set([]string{fieldGolden, "list", elem}, roleGolden)
	}
	// reward_model.ground_truth.target (Search-R1, Router-R1)
	var target parquet.Field
	for i, name := range strings.Split(fieldTarget, ".") {
		parent := parquet.Node(schema)
		if i > 0 {
			parent = target
		}
		if target = child(parent, name); target == nil {
			break
		}
	}
	if target != nil {
		elem, err := checkStringList(target)
		switch {
		case err == nil:
			set(append(strings.Split(fieldTarget, "."), "list", elem), roleTarget)
		case golden == nil:
			// Only a fallback for golden_answers: a bad layout matters only
			// when it is the sole source of answers.
			return nil, &ParseError{File: path, Field: fieldTarget, Err: err}
		}
	}
	return plan, nil
}

// child returns the field name of a group node, or nil.
func child(n parquet.Node, name string) parquet.Field {
	if n.Leaf() {
		return nil
	}
	for _, f := range n.Fields() {
		if f.Name() == name {
			return f
		}
	}
	return nil
}

// describe prints a field's schema on one line for error messages, e.g.
// "optional group golden_answers (LIST) { repeated group list { ... } }".
func describe(f parquet.Field) string {
	s := parquet.NewSchema("", parquet.Group{f.Name(): f}).String()
	s = strings.Join(strings.Fields(s), " ")
	s = strings.TrimSuffix(strings.TrimPrefix(s, "message {"), "}")
	return strings.TrimSpace(s)
}

// isStringLeaf reports whether n is a non-repeated BYTE_ARRAY leaf that is
// plain or annotated STRING/ENUM.
func isStringLeaf(n parquet.Node) bool {
	if !n.Leaf() || n.Repeated() || n.Type().Kind() != parquet.ByteArray {
		return false
	}
	lt := n.Type().LogicalType()
	if lt == nil || lt.Value == nil {
		return true
	}
	switch lt.Value.(type) {
	case *format.StringType, *format.EnumType:
		return true
	}
	return false
}

func checkString(n parquet.Node) error {
	if !isStringLeaf(n) {
		return errors.New("want string column")
	}
	return nil
}

func checkID(n parquet.Node) error {
	if isStringLeaf(n) {
		return nil
	}
	if n.Leaf() && !n.Repeated() {
		switch n.Type().Kind() {
		case parquet.Int32, parquet.Int64:
			return nil
		}
	}
	return errors.New("want string or integer column")
}

// checkStringList checks that n is a list<string> in the standard 3-level
// layout and returns the element's name ("element" or "item").
func checkStringList(n parquet.Field) (string, error) {
	bad := func(why string) (string, error) {
		return "", fmt.Errorf("unsupported layout for list<string> (%s): want a 3-level LIST, "+
			"group (LIST) { repeated group list { binary element (STRING) } }, the element named \"element\" or \"item\"; got %s", why, describe(n))
	}
	if n.Leaf() {
		return bad("not a group")
	}
	if n.Repeated() {
		return bad("repeated outer group")
	}
	if lt := n.Type().LogicalType(); lt == nil || !isListType(lt) {
		return bad("no LIST annotation")
	}
	fields := n.Fields()
	if len(fields) != 1 || fields[0].Name() != "list" || !fields[0].Repeated() || fields[0].Leaf() {
		return bad(`want one repeated group named "list"`)
	}
	elems := fields[0].Fields()
	if len(elems) != 1 {
		return bad("want one element field")
	}
	elem := elems[0]
	if name := elem.Name(); name != "element" && name != "item" {
		return bad(fmt.Sprintf("element named %q", name))
	}
	if !isStringLeaf(elem) {
		return bad("element is not a string")
	}
	return elem.Name(), nil
}

func isListType(lt *format.LogicalType) bool {
	_, ok := lt.Value.(*format.ListType)
	return ok
}

// record extracts our fields from one row.
func (p *parquetPlan) record(row parquet.Row) (record, string, error) {
	var rec record
	var err error
	var field string
	row.Range(func(col int, values []parquet.Value) bool {
		if col >= len(p.roles) {
			return true
		}
		switch p.roles[col] {
		case roleID:
			rec.id, err = scalarID(values)
			field = fieldID
		case roleQuestion:
			rec.question, err = scalar(values)
			field = fieldQuestion
		case roleDataSource:
			rec.dataSource, err = scalar(values)
			field = fieldDataSource
		case roleDataset:
			rec.dataset, err = scalar(values)
			field = fieldDataset
		case roleGolden:
			rec.golden = list(values)
		case roleTarget:
			rec.target = list(values)
		}
		return err == nil
	})
	if err != nil {
		return rec, field, err
	}
	return rec, "", nil
}

// scalar returns the string value of a non-repeated column; nil for null.
func scalar(values []parquet.Value) (*string, error) {
	if len(values) != 1 {
		return nil, fmt.Errorf("want one value, got %d", len(values))
	}
	if values[0].IsNull() {
		return nil, nil
	}
	s := string(values[0].ByteArray())
	return &s, nil
}

func scalarID(values []parquet.Value) (*string, error) {
	if len(values) != 1 {
		return nil, fmt.Errorf("want one value, got %d", len(values))
	}
	v := values[0]
	var s string
	switch {
	case v.IsNull():
		return nil, nil
	case v.Kind() == parquet.Int32:
		s = strconv.FormatInt(int64(v.Int32()), 10)
	case v.Kind() == parquet.Int64:
		s = strconv.FormatInt(v.Int64(), 10)
	default:
		s = string(v.ByteArray())
	}
	return &s, nil
}

// list returns the non-null elements of a list<string> column. A null list,
// an empty list and null elements all contribute nothing.
func list(values []parquet.Value) []string {
	var out []string
	for _, v := range values {
		if !v.IsNull() {
			out = append(out, string(v.ByteArray()))
		}
	}
	return out
}
