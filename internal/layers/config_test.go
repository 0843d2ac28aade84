package layers

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// wholeConfigReaders are the folders whose code may take the whole
// configuration (config.Config): the commands, with their preflight step,
// and the experiments (docs/development.md, "Packages"). config defines it;
// the test fixtures build it for the tests of the packages below.
var wholeConfigReaders = []string{"cmd", "bench", "experiments", "config", "internal/testing"}

// TestWholeConfigReaders fails when a non-test file outside
// wholeConfigReaders names config.Config: the packages below take their own
// table (config.Training, config.Rollout, router.Config, …), so that what
// each reads is visible in its signatures.
func TestWholeConfigReaders(t *testing.T) {
	const configPkg = "github.com/recal-project/recal/config"
	fset := token.NewFileSet()
	files := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || reader(rel)) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		name := ""
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); p == configPkg {
				name = "config"
				if imp.Name != nil {
					name = imp.Name.Name
				}
			}
		}
		if name == "" {
			return nil
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok && sel.Sel.Name == "Config" {
				if id, ok := sel.X.(*ast.Ident); ok && id.Name == name {
					t.Errorf("%s: names config.Config; only %v may take the whole configuration: take a table of it (config.Training, config.Rollout, …) or an options struct", fset.Position(sel.Pos()), wholeConfigReaders)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 50 {
		t.Fatalf("read %d Go files below the readers, want the module's", files)
	}
}

func reader(rel string) bool {
	for _, r := range wholeConfigReaders {
		if rel == r {
			return true
		}
	}
	return false
}
