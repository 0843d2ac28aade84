package layers

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// root is the module's root, relative to this package.
const root = "../.."

// TestModuleLayers fails when a package of the module imports one from a
// higher layer of docs/development.md, imports a test fixture outside its
// tests, or is missing from the table: the map a reader trusts would be
// wrong, and the packages below would no longer build without those above.
func TestModuleLayers(t *testing.T) {
	doc := filepath.Join(root, "docs", "development.md")
	md, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := Parse(md)
	if err != nil {
		t.Fatalf("%s: %v", doc, err)
	}
	pkgs := modulePackages(t)
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages, want the whole module: %v", len(pkgs), pkgs)
	}
	for _, v := range Check(layers, pkgs) {
		t.Errorf("%s (docs/development.md, \"Packages\")", v)
	}
}

// modulePackages lists the module's packages with `go list`, each with the
// module's packages its non-test files import. cgo is on, so the files that
// import "C" count whatever the test's own environment says.
func modulePackages(t *testing.T) []Package {
	t.Helper()
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
		}
		return string(out)
	}
	module := strings.TrimSpace(run("list", "-m", "-f", "{{.Path}}"))
	rel := func(path string) (string, bool) {
		if path == module {
			return ".", true
		}
		r, ok := strings.CutPrefix(path, module+"/")
		return r, ok
	}
	var pkgs []Package
	for _, line := range strings.Split(strings.TrimSpace(run("list", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", "./...")), "\n") {
		f := strings.Fields(line)
		path, ok := rel(f[0])
		if !ok {
			t.Fatalf("go list: %s is not in module %s", f[0], module)
		}
		p := Package{Path: path}
		for _, imp := range f[1:] {
			if r, ok := rel(imp); ok {
				p.Imports = append(p.Imports, r)
			}
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		md   string
		want []Layer
		err  string
	}{
		{
			name: "chains, patterns and both separators",
			md: "# Title\n\ntext\n\n| layer | packages |\n| --- | --- |\n" +
				"| top | `cmd/x`, `bench/...` |\n" +
				"| middle | `a` → `b` → `c`; `d` |\n" +
				"| bottom | `internal/e` |\n\nafter\n\n| other | table |\n| --- | --- |\n| x | y |\n",
			want: []Layer{
				{Name: "top", Chains: [][]string{{"cmd/x"}, {"bench/..."}}},
				{Name: "middle", Chains: [][]string{{"a", "b", "c"}, {"d"}}},
				{Name: "bottom", Chains: [][]string{{"internal/e"}}},
			},
		},
		{name: "no table", md: "| path | what |\n| --- | --- |\n| a | b |\n", err: ErrNoTable.Error()},
		{name: "prose in a cell", md: "| layer | packages |\n| --- | --- |\n| x | `a` (and `b`) |\n", err: "is not a package in backquotes"},
		{name: "a third cell", md: "| layer | packages |\n| --- | --- |\n| x | `a` | `b` |\n", err: "3 cells"},
		{name: "an empty cell", md: "| layer | packages |\n| --- | --- |\n| x |  |\n", err: "no packages"},
		{name: "no rows", md: "| layer | packages |\n| --- | --- |\n\n", err: "has no rows"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse([]byte(tc.md))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Parse: error %v, want one containing %q: a table the check cannot read must not pass as empty", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Parse:\n got %q\nwant %q", got, tc.want)
			}
		})
	}
	if _, err := Parse(nil); !errors.Is(err, ErrNoTable) {
		t.Errorf("Parse(nil): %v, want ErrNoTable", err)
	}
}

func TestCheck(t *testing.T) {
	layers := []Layer{
		{Name: "commands", Chains: [][]string{{"cmd/recal"}, {"bench/..."}}},
		{Name: "experiments", Chains: [][]string{{"experiments/table1", "experiments/sftdirect"}, {"experiments/ablate"}}},
		{Name: "jobs", Chains: [][]string{{"trainer"}, {"eval"}}},
		{Name: "libraries", Chains: [][]string{{"router"}, {"data"}}},
	}
	// ok is a module that keeps every rule; each case below adds one import
	// or package to it.
	ok := []Package{
		{Path: "cmd/recal", Imports: []string{"experiments/table1", "trainer", "data"}},
		{Path: "bench", Imports: []string{"bench/engine", "trainer"}},
		{Path: "bench/engine", Imports: []string{"data"}},
		{Path: "experiments/table1", Imports: []string{"experiments/sftdirect", "eval", "trainer"}},
		{Path: "experiments/sftdirect", Imports: []string{"trainer"}},
		{Path: "experiments/ablate", Imports: []string{"eval", "trainer"}},
		{Path: "trainer", Imports: []string{"router", "data"}},
		{Path: "eval", Imports: []string{"router"}},
		{Path: "router", Imports: nil},
		{Path: "data", Imports: nil},
		{Path: "internal/testing/testenv", Imports: []string{"trainer", "cmd/recal"}},
	}
	tests := []struct {
		name string
		add  Package
		want []string
	}{
		{name: "the module as it is", want: nil},
		{name: "an import from a higher layer", add: Package{Path: "data", Imports: []string{"trainer"}},
			want: []string{`data imports trainer: layer "jobs" is above "libraries"`}},
		{name: "a sibling without an arrow", add: Package{Path: "eval", Imports: []string{"trainer"}},
			want: []string{`eval imports trainer: both in layer "jobs", and no arrow of the table leads from eval to trainer`}},
		{name: "against an arrow", add: Package{Path: "experiments/sftdirect", Imports: []string{"experiments/table1"}},
			want: []string{`experiments/sftdirect imports experiments/table1: both in layer "experiments", and no arrow of the table leads from experiments/sftdirect to experiments/table1`}},
		{name: "across chains of one layer", add: Package{Path: "experiments/ablate", Imports: []string{"experiments/sftdirect"}},
			want: []string{`experiments/ablate imports experiments/sftdirect: both in layer "experiments", and no arrow of the table leads from experiments/ablate to experiments/sftdirect`}},
		{name: "a fixture outside tests", add: Package{Path: "trainer", Imports: []string{"internal/testing/testenv"}},
			want: []string{"trainer imports internal/testing/testenv: a test fixture, which only test files may import"}},
		{name: "a package in no layer", add: Package{Path: "newpkg", Imports: []string{"trainer"}},
			want: []string{"newpkg: in no layer of the table; add it to the row of the layer it belongs to"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pkgs := append([]Package(nil), ok...)
			if tc.add.Path != "" {
				merged := false
				for i := range pkgs {
					if pkgs[i].Path == tc.add.Path {
						pkgs[i].Imports = append(append([]string(nil), pkgs[i].Imports...), tc.add.Imports...)
						merged = true
					}
				}
				if !merged {
					pkgs = append(pkgs, tc.add)
				}
			}
			var got []string
			for _, v := range Check(layers, pkgs) {
				got = append(got, v.String())
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Check:\n got %q\nwant %q", got, tc.want)
			}
		})
	}

	t.Run("a stale entry and a package in two places", func(t *testing.T) {
		stale := append(append([]Layer(nil), layers...), Layer{Name: "leaves", Chains: [][]string{{"gone"}, {"data"}}})
		var got []string
		for _, v := range Check(stale, ok) {
			got = append(got, v.String())
		}
		want := []string{
			"data: in 2 places of the table, want one",
			`gone: the table's layer "leaves" names it, but the module has no such package`,
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("Check:\n got %q\nwant %q", got, want)
		}
	})
}
