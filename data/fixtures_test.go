package data

// This file writes the Parquet fixtures under testdata/ with parquet-go
// itself. Regenerate them with
//
//	go test ./data -run TestParquetFixtures -update
//
// Rows are built value by value (repetition and definition levels set by
// hand) rather than through parquet-go's struct mapping, so the fixtures do
// not depend on the reflection path whose "item"/"element" confusion they
// exist to catch.

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"
)

var update = flag.Bool("update", false, "rewrite the Parquet fixtures in testdata/")

// listGroup is a group annotated LIST whose children are given as is, to
// write layouts that parquet.List cannot (element named "item", 2-level).
type listGroup struct{ parquet.Group }

func (listGroup) Type() parquet.Type { return parquet.List(parquet.String()).Type() }

// fixtureRow maps a dotted leaf column path to its value: string, int64,
// []string, []int64 or []any (nil elements are null). Absent or nil means a
// null at the outermost level.
type fixtureRow map[string]any

type fixture struct {
	name   string
	schema *parquet.Schema
	rows   []fixtureRow
}

func optString() parquet.Node { return parquet.Optional(parquet.String()) }

// stringList is list<string> in the 3-level layout with the given element
// name, as pyarrow ("element") or older parquet-cpp ("item") write it.
func stringList(elem string) parquet.Node {
	return parquet.Optional(listGroup{parquet.Group{
		"list": parquet.Repeated(parquet.Group{elem: optString()}),
	}})
}

func fixtures() []fixture {
	return []fixture{
		{
			// FlashRAG as Hugging Face datasets writes it: string ids,
			// element named "element", an extra metadata struct.
			name: "flashrag_element.parquet",
			schema: parquet.NewSchema("schema", parquet.Group{
				"id":             optString(),
				"question":       optString(),
				"golden_answers": stringList("element"),
				"metadata": parquet.Optional(parquet.Group{
					"popularity": parquet.Optional(parquet.Int(64)),
				}),
			}),
			rows: []fixtureRow{
				{"id": "test_0", "question": "who wrote hamlet", "golden_answers.list.element": []string{"William Shakespeare", "Shakespeare"}, "metadata.popularity": int64(7)},
				{"id": "test_1", "question": "  What is the capital of France?  ", "golden_answers.list.element": []any{" Paris ", nil, ""}},
				{"id": "test_2", "question": "how many legs does a spider have", "golden_answers.list.element": []string{"8", "eight"}},
			},
		},
		{
			// Older parquet-cpp: element named "item"; integer ids.
			name: "flashrag_item.parquet",
			schema: parquet.NewSchema("schema", parquet.Group{
				"id":             parquet.Optional(parquet.Int(64)),
				"question":       optString(),
				"golden_answers": stringList("item"),
				"dataset":        optString(),
			}),
			rows: []fixtureRow{
				{"id": int64(10), "question": "who wrote hamlet", "golden_answers.list.item": []string{"William Shakespeare", "Shakespeare"}, "dataset": "popqa"},
				{"id": int64(11), "question": "What is the capital of France?", "golden_answers.list.item": []string{"Paris"}, "dataset": "popqa"},
			},
		},
		{
			// Router-R1's merged training file: nq and hotpotqa rows with
			// the same FlashRAG ids, a chat prompt, and the answers both in
			// golden_answers and reward_model.ground_truth.target (the last
			// row only in the latter).
			name: "routerr1_mixed.parquet",
			schema: parquet.NewSchema("schema", parquet.Group{
				"data_source":    optString(),
				"id":             optString(),
				"question":       optString(),
				"golden_answers": stringList("element"),
				"ability":        optString(),
				"prompt": parquet.Optional(parquet.List(parquet.Optional(parquet.Group{
					"content": optString(),
					"role":    optString(),
				}))),
				"reward_model": parquet.Optional(parquet.Group{
					"ground_truth": parquet.Optional(parquet.Group{
						"target": parquet.Optional(parquet.List(parquet.String())),
					}),
					"style": optString(),
				}),
				"extra_info": parquet.Optional(parquet.Group{
					"index": parquet.Optional(parquet.Int(64)),
					"split": optString(),
				}),
			}),
			rows: []fixtureRow{
				routerRow("nq", "train_0", "who sang the song i will survive", []string{"Gloria Gaynor"}, []string{"Gloria Gaynor"}, 0),
				routerRow("hotpotqa", "train_0", "Which magazine was started first Arthur's Magazine or First for Women?", []string{"Arthur's Magazine"}, []string{"Arthur's Magazine"}, 1),
				routerRow("nq", "train_1", "when did the eiffel tower open", nil, []string{"31 March 1889", "1889"}, 2),
			},
		},
		{
			name: "bad_list_name.parquet",
			schema: parquet.NewSchema("schema", parquet.Group{
				"id":             optString(),
				"question":       optString(),
				"golden_answers": stringList("value"),
			}),
			rows: []fixtureRow{{"id": "0", "question": "q", "golden_answers.list.value": []string{"a"}}},
		},
		{
			// Legacy 2-level list: the repeated leaf sits right under the
			// LIST group.
			name: "bad_list_two_level.parquet",
			schema: parquet.NewSchema("schema", parquet.Group{
				"id":             optString(),
				"question":       optString(),
				"golden_answers": parquet.Optional(listGroup{parquet.Group{"array": parquet.Repeated(parquet.String())}}),
			}),
			rows: []fixtureRow{{"id": "0", "question": "q", "golden_answers.array": []string{"a"}}},
		},
		{
			name: "bad_list_int.parquet",
			schema: parquet.NewSchema("schema", parquet.Group{
				"id":             optString(),
				"question":       optString(),
				"golden_answers": parquet.Optional(parquet.List(parquet.Optional(parquet.Int(64)))),
			}),
			rows: []fixtureRow{{"id": "0", "question": "q", "golden_answers.list.element": []int64{1}}},
		},
		{
			name: "bad_golden_string.parquet",
			schema: parquet.NewSchema("schema", parquet.Group{
				"id":             optString(),
				"question":       optString(),
				"golden_answers": optString(),
			}),
			rows: []fixtureRow{{"id": "0", "question": "q", "golden_answers": "a"}},
		},
	}
}

func routerRow(ds, id, question string, golden, target []string, index int64) fixtureRow {
	q := question
	if !strings.HasSuffix(q, "?") {
		q += "?"
	}
	r := fixtureRow{
		"data_source":                 ds,
		"id":                          id,
		"question":                    question,
		"ability":                     "fact-reasoning",
		"prompt.list.element.content": []string{"Answer the given question. Question: " + q},
		"prompt.list.element.role":    []string{"user"},
		"reward_model.ground_truth.target.list.element": target,
		"reward_model.style":                            "rule",
		"extra_info.index":                              index,
		"extra_info.split":                              "train",
	}
	if golden != nil {
		r["golden_answers.list.element"] = golden
	}
	return r
}

// build writes f as Parquet bytes.
func (f fixture) build() ([]byte, error) {
	var buf bytes.Buffer
	w := parquet.NewWriter(&buf, f.schema, parquet.CreatedBy("recal data fixtures", "1", "0"))
	for i, fr := range f.rows {
		row, err := f.row(fr)
		if err != nil {
			return nil, fmt.Errorf("%s row %d: %w", f.name, i, err)
		}
		if _, err := w.WriteRows([]parquet.Row{row}); err != nil {
			return nil, fmt.Errorf("%s row %d: %w", f.name, i, err)
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// row lays out one fixture row as Parquet values, column by column.
func (f fixture) row(fr fixtureRow) (parquet.Row, error) {
	var row parquet.Row
	used := 0
	for col, path := range f.schema.Columns() {
		leaf, _ := f.schema.Lookup(path...)
		key := strings.Join(path, ".")
		maxDef, maxRep := leaf.MaxDefinitionLevel, leaf.MaxRepetitionLevel
		v, ok := fr[key]
		if ok {
			used++
		}
		var items []any
		switch x := v.(type) {
		case nil:
			row = append(row, parquet.NullValue().Level(0, 0, col))
			continue
		case string, int64:
			if maxRep != 0 {
				return nil, fmt.Errorf("%s: scalar for a repeated column", key)
			}
			row = append(row, parquet.ValueOf(x).Level(0, maxDef, col))
			continue
		case []string:
			for _, s := range x {
				items = append(items, s)
			}
		case []int64:
			for _, n := range x {
				items = append(items, n)
			}
		case []any:
			items = x
		default:
			return nil, fmt.Errorf("%s: unsupported value %T", key, v)
		}
		if maxRep != 1 {
			return nil, fmt.Errorf("%s: list for a column with repetition level %d", key, maxRep)
		}
		elemOptional := 0
		if leaf.Node.Optional() {
			elemOptional = 1
		}
		if len(items) == 0 { // empty list: defined up to the list group
			row = append(row, parquet.NullValue().Level(0, maxDef-1-elemOptional, col))
			continue
		}
		for i, item := range items {
			rep := 0
			if i > 0 {
				rep = 1
			}
			if item == nil {
				row = append(row, parquet.NullValue().Level(rep, maxDef-1, col))
			} else {
				row = append(row, parquet.ValueOf(item).Level(rep, maxDef, col))
			}
		}
	}
	if used != len(fr) {
		return nil, fmt.Errorf("row names %d columns, schema has %d of them: %v", len(fr), used, fr)
	}
	return row, nil
}

// TestParquetFixtures checks that testdata/ holds what fixtures() writes,
// and rewrites it with -update.
func TestParquetFixtures(t *testing.T) {
	for _, f := range fixtures() {
		t.Run(f.name, func(t *testing.T) {
			want, err := f.build()
			if err != nil {
				t.Fatalf("building fixture: %v", err)
			}
			path := filepath.Join("testdata", f.name)
			if *update {
				if err := os.WriteFile(path, want, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v; want the fixture (run go test ./data -run TestParquetFixtures -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s differs from what fixtures() writes (%d bytes, want %d); run go test ./data -run TestParquetFixtures -update", path, len(got), len(want))
			}
		})
	}
}
