package data

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"
)

func TestLoadParquet(t *testing.T) {
	tests := []struct {
		file string
		opts LoadOptions
		want []Example
	}{
		{
			// pyarrow's layout: element named "element".
			file: "flashrag_element.parquet",
			opts: LoadOptions{Dataset: "nq"},
			want: []Example{
				{ID: "nq/test_0", SourceID: "test_0", Dataset: "nq", Question: "who wrote hamlet?", Golden: []string{"William Shakespeare", "Shakespeare"}},
				{ID: "nq/test_1", SourceID: "test_1", Dataset: "nq", Question: "What is the capital of France?", Golden: []string{"Paris"}},
				{ID: "nq/test_2", SourceID: "test_2", Dataset: "nq", Question: "how many legs does a spider have?", Golden: []string{"8", "eight"}},
			},
		},
		{
			// Older parquet-cpp's layout: element named "item"; integer ids;
			// the dataset from the rows' dataset column.
			file: "flashrag_item.parquet",
			want: []Example{
				{ID: "popqa/10", SourceID: "10", Dataset: "popqa", Question: "who wrote hamlet?", Golden: []string{"William Shakespeare", "Shakespeare"}},
				{ID: "popqa/11", SourceID: "11", Dataset: "popqa", Question: "What is the capital of France?", Golden: []string{"Paris"}},
			},
		},
		{
			// Router-R1's merged file, every row; the last row's answers
			// come from reward_model.ground_truth.target.
			file: "routerr1_mixed.parquet",
			want: []Example{
				{ID: "nq/train_0", SourceID: "train_0", Dataset: "nq", Question: "who sang the song i will survive?", Golden: []string{"Gloria Gaynor"}},
				{ID: "hotpotqa/train_0", SourceID: "train_0", Dataset: "hotpotqa", Question: "Which magazine was started first Arthur's Magazine or First for Women?", Golden: []string{"Arthur's Magazine"}},
				{ID: "nq/train_1", SourceID: "train_1", Dataset: "nq", Question: "when did the eiffel tower open?", Golden: []string{"31 March 1889", "1889"}},
			},
		},
		{
			file: "routerr1_mixed.parquet",
			opts: LoadOptions{Dataset: "hotpotqa"},
			want: []Example{
				{ID: "hotpotqa/train_0", SourceID: "train_0", Dataset: "hotpotqa", Question: "Which magazine was started first Arthur's Magazine or First for Women?", Golden: []string{"Arthur's Magazine"}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.file+"/"+tt.opts.Dataset, func(t *testing.T) {
			got, err := LoadFile(filepath.Join("testdata", tt.file), tt.opts)
			if err != nil {
				t.Fatalf("LoadFile: %v; want success", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

// TestParquetFixturesIndependentReader reads the list fixtures through
// parquet-go's map reader, a different code path from ours, so that a
// fixture our reader misreads in the same way as it was written would show.
func TestParquetFixturesIndependentReader(t *testing.T) {
	for _, name := range []string{"flashrag_element.parquet", "flashrag_item.parquet"} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join("testdata", name)
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			r := parquet.NewReader(f)
			defer r.Close()
			var want [][]string
			for {
				row := map[string]any{}
				if err := r.Read(&row); err == io.EOF {
					break
				} else if err != nil {
					t.Fatal(err)
				}
				var answers []string
				for _, a := range row["golden_answers"].([]any) {
					if s, ok := a.(string); ok && strings.TrimSpace(s) != "" {
						answers = append(answers, strings.TrimSpace(s))
					}
				}
				want = append(want, answers)
			}
			examples, err := LoadFile(path, LoadOptions{Dataset: "popqa"})
			if err != nil {
				t.Fatal(err)
			}
			var got [][]string
			for _, ex := range examples {
				got = append(got, ex.Golden)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("golden answers %q, the map reader sees %q; want the same", got, want)
			}
		})
	}
}

func TestLoadParquetBadLayouts(t *testing.T) {
	tests := []struct {
		file string
		why  string
	}{
		{"bad_list_name.parquet", `element named "value"`},
		{"bad_list_two_level.parquet", `want one repeated group named "list"`},
		{"bad_list_int.parquet", `element is not a string`},
		{"bad_golden_string.parquet", `not a group`},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			path := filepath.Join("testdata", tt.file)
			_, err := LoadFile(path, LoadOptions{Dataset: "nq"})
			want := "data: " + path + `: field "golden_answers": unsupported layout for list<string> (` + tt.why + ")"
			if err == nil || !strings.HasPrefix(err.Error(), want) {
				t.Errorf("error = %v\nwant prefix %q: an unexpected list layout must fail loudly, naming file and column, not yield empty answers", err, want)
			}
		})
	}
}

func TestLoadParquetCorrupt(t *testing.T) {
	good, err := os.ReadFile(filepath.Join("testdata", "flashrag_element.parquet"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		content []byte
	}{
		{"not parquet", []byte("question,answer\nq,a\n")},
		{"truncated", good[:len(good)/2]},
		{"empty", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, "f.parquet", string(tt.content))
			_, err := LoadFile(path, LoadOptions{Dataset: "nq"})
			var pe *ParseError
			if !errors.As(err, &pe) || pe.File != path {
				t.Errorf("error = %v; want a *ParseError naming %s", err, path)
			}
		})
	}
}

func TestLoadParquetBadScalar(t *testing.T) {
	// bad_list_int's golden_answers is wrong, but a bad question column must
	// be reported as such: build one with an integer question.
	path := filepath.Join(t.TempDir(), "f.parquet")
	f := fixture{
		name: "int_question",
		schema: parquet.NewSchema("schema", parquet.Group{
			"question":       parquet.Optional(parquet.Int(64)),
			"golden_answers": stringList("element"),
		}),
		rows: []fixtureRow{{"question": int64(1), "golden_answers.list.element": []string{"a"}}},
	}
	b, err := f.build()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = LoadFile(path, LoadOptions{Dataset: "nq"})
	want := "data: " + path + `: field "question": want string column, got optional int64 question`
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error = %v\nwant prefix %q", err, want)
	}
}
