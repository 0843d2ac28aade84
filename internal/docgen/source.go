// Package docgen renders recal's reference pages from the code that knows
// the truth: docs/config.md from the typed configuration and the doc comments
// of its fields, docs/cli.md from the command tree's own help. Its functions
// are pure but for reading Go source files; cmd/recal's TestDocs writes the
// pages and fails when they are stale.
package docgen

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// typeDoc is what the source says about one struct type.
type typeDoc struct {
	doc    string            // the type's doc comment
	fields map[string]string // field name → its doc comment (or line comment)
}

// sourceDocs reads doc comments from the Go files of the module rooted at
// root, one package at a time, as reflect names the types.
type sourceDocs struct {
	root, module string
	pkgs         map[string]map[string]typeDoc // import path → type name → docs
}

// newSourceDocs reads the module path from root/go.mod.
func newSourceDocs(root string) (*sourceDocs, error) {
	f, err := os.Open(filepath.Join(root, "go.mod"))
	if err != nil {
		return nil, fmt.Errorf("docgen: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return &sourceDocs{root: root, module: strings.Trim(strings.TrimSpace(m), `"`), pkgs: map[string]map[string]typeDoc{}}, nil
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("docgen: %s: %w", f.Name(), err)
	}
	return nil, fmt.Errorf("docgen: %s: no module line", f.Name())
}

// lookup returns the docs of the struct type name of package pkgPath.
func (s *sourceDocs) lookup(pkgPath, name string) (typeDoc, error) {
	types, ok := s.pkgs[pkgPath]
	if !ok {
		rel, ok := strings.CutPrefix(pkgPath, s.module)
		if !ok || rel != "" && rel[0] != '/' {
			return typeDoc{}, fmt.Errorf("docgen: type %s.%s is outside module %s", pkgPath, name, s.module)
		}
		var err error
		if types, err = parseDir(filepath.Join(s.root, filepath.FromSlash(strings.TrimPrefix(rel, "/")))); err != nil {
			return typeDoc{}, err
		}
		s.pkgs[pkgPath] = types
	}
	td, ok := types[name]
	if !ok {
		return typeDoc{}, fmt.Errorf("docgen: no struct type %s in the source of %s", name, pkgPath)
	}
	return td, nil
}

// parseDir collects the struct types declared in the Go files of dir, those
// of non-test files first (a test file's type of the same name is ignored).
func parseDir(dir string) (map[string]typeDoc, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, fmt.Errorf("docgen: %w", err)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("docgen: no Go files in %s", dir)
	}
	sort.SliceStable(names, func(i, j int) bool {
		return !strings.HasSuffix(names[i], "_test.go") && strings.HasSuffix(names[j], "_test.go")
	})
	out := map[string]typeDoc{}
	fset := token.NewFileSet()
	for _, name := range names {
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			return nil, fmt.Errorf("docgen: %w", err)
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, spec := range gd.Specs {
				ts := spec.(*ast.TypeSpec)
				st, ok := ts.Type.(*ast.StructType)
				if !ok {
					continue
				}
				if _, seen := out[ts.Name.Name]; seen {
					continue
				}
				doc := ts.Doc.Text()
				if doc == "" && len(gd.Specs) == 1 {
					doc = gd.Doc.Text()
				}
				td := typeDoc{doc: doc, fields: map[string]string{}}
				for _, fld := range st.Fields.List {
					text := fld.Doc.Text()
					if text == "" {
						text = fld.Comment.Text()
					}
					for _, n := range fld.Names {
						td.fields[n.Name] = text
					}
					if len(fld.Names) == 0 { // embedded: named by its type
						td.fields[embeddedName(fld.Type)] = text
					}
				}
				out[ts.Name.Name] = td
			}
		}
	}
	return out, nil
}

// embeddedName is the field name of an embedded type expression.
func embeddedName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return embeddedName(e.X)
	case *ast.SelectorExpr:
		return e.Sel.Name
	case *ast.Ident:
		return e.Name
	case *ast.IndexExpr:
		return embeddedName(e.X)
	}
	return ""
}
