package docgen

import (
	"strings"
	"testing"
)

// The fields of a line type as encoding/json writes them: tags, omitempty,
// skipped and unexported fields, an inlined embedded struct, nested structs
// of another package under their field's name, and the JSON types.
func TestOutputsDescribe(t *testing.T) {
	w := &structWalker{root: "testdata/outmod", module: "example.com/outmod", pkgs: map[string]*astPackage{}}
	got, file, err := w.describe(".", "Line")
	if err != nil {
		t.Fatal(err)
	}
	want := []outField{
		{"step", "integer", "the step", false, "..Line.Step"},
		{"rewards", "object of number", "Rewards by component.", false, "..Line.Rewards"},
		{"calls", "array of object", "", false, "..Line.Calls"},
		{"calls[].model", "string", `the model \| its name`, false, "sub.Call.Model"},
		{"calls[].nested", "object", "", false, "sub.Call.Nested"},
		{"calls[].nested.a", "boolean", "", false, ".A"},
		{"took_ns", "integer (nanoseconds)", "", true, "..Line.Took"},
		{"loss", "number", "value loss (set for PPO only)", false, "..Extra.Loss"},
		{"kind", "string", "a named string", false, "..Line.Kind"},
		{"NoTag", "boolean", "", false, "..Line.NoTag"},
		{"first", "integer", "First and Second are documented together.", false, "..Line.First"},
		{"second", "integer", "First and Second are documented together.", false, "..Line.Second"},
		{"third", "integer", "", false, "..Line.Third"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d fields %v, want %d %v", len(got), got, len(want), want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("field %d: got %+v, want %+v (the page would describe the file wrongly)", i, got[i], want[i])
		}
	}
	if file != "line.go" {
		t.Errorf("file %q, want line.go (the page names where the type lives)", file)
	}
}

// A type the walker cannot find is an error naming it, not a silent gap in
// the page.
func TestOutputsMissingType(t *testing.T) {
	for _, c := range []struct{ pkg, typ, want string }{
		{".", "Nope", "no type Nope"},
		{"missing", "Line", "missing"},
	} {
		_, err := OutputsPage{Root: "testdata/outmod", Regenerate: "x",
			Sections: []OutputSection{{Title: "t", Files: []OutputFile{{Path: "f.jsonl", Pkg: c.pkg, Type: c.typ}}}}}.Markdown()
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "f.jsonl") {
			t.Errorf("%s.%s: error %v, want one naming %q and the file", c.pkg, c.typ, err, c.want)
		}
	}
}

// The page lists every file with an anchor that its heading has.
func TestOutputsPageAnchors(t *testing.T) {
	b, err := OutputsPage{Root: "testdata/outmod", Intro: "Intro.", Regenerate: "regen", Notes: map[string]string{"..Line.Third": "the third | last"},
		Sections: []OutputSection{{Title: "Run", Files: []OutputFile{
			{Path: "RUN_DIR/line.jsonl", About: "One line per step.", Pkg: ".", Type: "Line"},
			{Path: "RUN_DIR/config.toml", About: "The configuration."}}}}}.Markdown()
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	for _, want := range []string{"[`RUN_DIR/line.jsonl`](#run_dirlinejsonl)", "### RUN_DIR/line.jsonl", "| `calls[].nested.a` | boolean |  |",
		"Type: `..Line` (line.go)", "| `took_ns` | integer (nanoseconds) | *(omitted when empty)* |", "| `third` | integer | the third \\| last |"} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q:\n%s", want, page)
		}
	}
}

// A note may only fill a field the code leaves undocumented, and only a
// field that exists: otherwise it would contradict or outlive the code.
func TestOutputsNotes(t *testing.T) {
	for _, c := range []struct {
		notes map[string]string
		want  string
	}{
		{map[string]string{"..Line.Step": "x"}, "which the code documents"},
		{map[string]string{"..Line.Gone": "x"}, "no file of the page has: ..Line.Gone"},
	} {
		_, err := OutputsPage{Root: "testdata/outmod", Regenerate: "x", Notes: c.notes,
			Sections: []OutputSection{{Title: "t", Files: []OutputFile{{Path: "f.jsonl", Pkg: ".", Type: "Line"}}}}}.Markdown()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("notes %v: error %v, want one saying %q", c.notes, err, c.want)
		}
	}
}
