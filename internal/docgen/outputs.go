package docgen

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
)

// OutputsPage is what docs/outputs.md is made from: the files recal writes,
// each described field by field from the Go struct that is encoded into it
// (its json tags, its field types and their doc comments), read from the
// source, so unexported line types are described too.
type OutputsPage struct {
	// Root is the module's root folder (holding go.mod).
	Root string
	// Intro is the page's introduction (Markdown).
	Intro string
	// Sections group the files, in order.
	Sections []OutputSection
	// Regenerate is the command that rewrites the page.
	Regenerate string
	// Notes say what a field means where its Go field has no doc comment,
	// keyed by package, type and Go field name ("router.Call.Query"); a
	// note applies wherever the field appears. A note no file uses, or for
	// a field the code documents, is an error: the code's comment wins,
	// and a note never outlives its field.
	Notes map[string]string
}

// OutputSection is a heading of the page and its files.
type OutputSection struct {
	Title string
	About string // Markdown, may be empty
	Files []OutputFile
}

// OutputFile is one file (or one kind of file) recal writes.
type OutputFile struct {
	Path  string // as the user sees it: "RUN_DIR/metrics.jsonl"
	About string // Markdown: who writes it, when, one line per what
	Pkg   string // the package folder of Type, relative to Root: "trainer"
	Type  string // the Go type encoded per line (JSON Lines) or whole (JSON); "" for a file with no schema of its own
}

// outField is one row of a file's table.
type outField struct {
	name, typ, doc string
	omit           bool   // omitempty: "(omitted when empty)" follows the doc
	goKey          string // package.Type.Field, what notes are keyed by
}

// text is the field's meaning cell.
func (f outField) text() string {
	if !f.omit {
		return f.doc
	}
	if f.doc == "" {
		return "*(omitted when empty)*"
	}
	return f.doc + " *(omitted when empty)*"
}

// applyNotes fills the meaning of undocumented fields from notes, marking
// the notes used in seen.
func applyNotes(fields []outField, notes map[string]string, seen map[string]bool) error {
	for i := range fields {
		n, ok := notes[fields[i].goKey]
		if !ok {
			continue
		}
		seen[fields[i].goKey] = true
		if fields[i].doc != "" {
			return fmt.Errorf("a note for %s, which the code documents (%q): remove the note", fields[i].goKey, fields[i].doc)
		}
		fields[i].doc = escape(n)
	}
	return nil
}

// Markdown renders the page.
func (p OutputsPage) Markdown() ([]byte, error) {
	src, err := newSourceDocs(p.Root)
	if err != nil {
		return nil, err
	}
	w := &structWalker{root: p.Root, module: src.module, pkgs: map[string]*astPackage{}}
	used := map[string]bool{}
	var b strings.Builder
	fmt.Fprintf(&b, "# Output files\n\n<!-- Generated from the code by `%s`. Do not edit. -->\n\n", p.Regenerate)
	b.WriteString(strings.TrimSpace(p.Intro) + "\n\n")
	fmt.Fprintf(&b, "Each table lists a file's fields as `encoding/json` writes them, from the Go type named under its heading and the doc comments of its fields; a field marked *omitted when empty* is left out when it is zero. A test fails when this page is stale; `%s` rewrites it.\n\n", p.Regenerate)
	b.WriteString("## Files\n\n")
	for _, s := range p.Sections {
		fmt.Fprintf(&b, "- %s:", s.Title)
		for i, f := range s.Files {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, " [`%s`](#%s)", f.Path, slug(f.Path))
		}
		b.WriteString("\n")
	}
	for _, s := range p.Sections {
		fmt.Fprintf(&b, "\n## %s\n", s.Title)
		if s.About != "" {
			fmt.Fprintf(&b, "\n%s\n", strings.TrimSpace(s.About))
		}
		for _, f := range s.Files {
			fmt.Fprintf(&b, "\n### %s\n\n%s\n", f.Path, strings.TrimSpace(f.About))
			if f.Type == "" {
				continue
			}
			fields, file, err := w.describe(f.Pkg, f.Type)
			if err != nil {
				return nil, fmt.Errorf("docgen: %s: %w", f.Path, err)
			}
			if err := applyNotes(fields, p.Notes, used); err != nil {
				return nil, fmt.Errorf("docgen: %s: %w", f.Path, err)
			}
			fmt.Fprintf(&b, "\nType: `%s.%s` (%s).\n\n| field | type | meaning |\n| --- | --- | --- |\n", filepath.Base(f.Pkg), f.Type, file)
			for _, fl := range fields {
				fmt.Fprintf(&b, "| %s | %s | %s |\n", code(fl.name), fl.typ, fl.text())
			}
		}
	}
	var unused []string
	for k := range p.Notes {
		if !used[k] {
			unused = append(unused, k)
		}
	}
	if len(unused) > 0 {
		sort.Strings(unused)
		return nil, fmt.Errorf("docgen: notes for fields no file of the page has: %s", strings.Join(unused, ", "))
	}
	return []byte(b.String()), nil
}

// astPackage is the parsed source of one package: its struct and other
// named types, each with the imports of the file declaring it.
type astPackage struct {
	types map[string]astType
}

type astType struct {
	expr    ast.Expr
	imports map[string]string // local name → import path
	file    string            // the file's path relative to the module root
}

// structWalker resolves named types across the module's packages.
type structWalker struct {
	root, module string
	pkgs         map[string]*astPackage // by folder relative to root
}

func (w *structWalker) pkg(dir string) (*astPackage, error) {
	if p, ok := w.pkgs[dir]; ok {
		return p, nil
	}
	names, err := filepath.Glob(filepath.Join(w.root, filepath.FromSlash(dir), "*.go"))
	if err != nil {
		return nil, err
	}
	p := &astPackage{types: map[string]astType{}}
	fset := token.NewFileSet()
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		imports := map[string]string{}
		for _, im := range f.Imports {
			path, _ := strconv.Unquote(im.Path.Value)
			local := filepath.Base(path)
			if im.Name != nil {
				local = im.Name.Name
			}
			imports[local] = path
		}
		rel, _ := filepath.Rel(w.root, name)
		for _, decl := range f.Decls {
			if gd, ok := decl.(*ast.GenDecl); ok && gd.Tok == token.TYPE {
				for _, spec := range gd.Specs {
					ts := spec.(*ast.TypeSpec)
					p.types[ts.Name.Name] = astType{expr: ts.Type, imports: imports, file: filepath.ToSlash(rel)}
				}
			}
		}
	}
	if len(p.types) == 0 {
		return nil, fmt.Errorf("no Go types in %s", dir)
	}
	w.pkgs[dir] = p
	return p, nil
}

// lookup finds the named type name of package folder dir.
func (w *structWalker) lookup(dir, name string) (astType, error) {
	p, err := w.pkg(dir)
	if err != nil {
		return astType{}, err
	}
	t, ok := p.types[name]
	if !ok {
		return astType{}, fmt.Errorf("no type %s in %s", name, dir)
	}
	return t, nil
}

// describe lists the JSON fields of the struct type name of package dir.
func (w *structWalker) describe(dir, name string) ([]outField, string, error) {
	t, err := w.lookup(dir, name)
	if err != nil {
		return nil, "", err
	}
	st, ok := t.expr.(*ast.StructType)
	if !ok {
		return nil, "", fmt.Errorf("%s.%s is not a struct", dir, name)
	}
	var out []outField
	if err := w.fields(dir, filepath.Base(dir)+"."+name, t.imports, st, "", "", &out, 0); err != nil {
		return nil, "", err
	}
	return out, t.file, nil
}

// fields appends the JSON fields of st under prefix, descending into the
// module's struct types (depth-bounded against recursive types).
func (w *structWalker) fields(dir, owner string, imports map[string]string, st *ast.StructType, prefix, note string, out *[]outField, depth int) error {
	if depth > 4 {
		return nil
	}
	lastDoc := "" // the doc comment above the previous field
	for _, f := range st.Fields.List {
		tag := ""
		if f.Tag != nil {
			s, _ := strconv.Unquote(f.Tag.Value)
			tag = reflect.StructTag(s).Get("json")
		}
		if tag == "-" {
			continue
		}
		jsonName, opts, _ := strings.Cut(tag, ",")
		omit := strings.Contains(","+opts+",", ",omitempty,")
		doc := strings.Join(strings.Fields(f.Doc.Text()), " ")
		above := doc
		if doc == "" {
			doc = strings.Join(strings.Fields(f.Comment.Text()), " ")
		}
		if doc == "" && len(f.Names) == 1 && mentions(lastDoc, f.Names[0].Name) {
			// "F1 and EM score Answer against Golden": a comment above a
			// field that names the fields after it documents them too.
			doc = lastDoc
		}
		if above != "" {
			lastDoc = above
		}
		names := f.Names
		if len(names) == 0 { // embedded
			if jsonName == "" {
				// encoding/json inlines an embedded struct's fields.
				edir, eowner, eimp, est, ok, err := w.resolveStruct(dir, imports, f.Type)
				if err != nil {
					return err
				}
				if ok {
					if err := w.fields(edir, eowner, eimp, est, prefix, doc, out, depth+1); err != nil {
						return err
					}
					continue
				}
			}
			names = []*ast.Ident{{Name: embeddedName(f.Type)}}
		}
		for _, n := range names {
			if !ast.IsExported(n.Name) {
				continue
			}
			name := jsonName
			if name == "" {
				name = n.Name
			}
			typ, sub, err := w.jsonType(dir, imports, f.Type)
			if err != nil {
				return err
			}
			text := escape(doc)
			if note != "" {
				// A field of an inlined embedded struct: its comment says when.
				text = strings.TrimSpace(text + " (" + escape(note) + ")")
			}
			*out = append(*out, outField{name: prefix + name, typ: typ, doc: text, omit: omit, goKey: owner + "." + n.Name})
			if sub != nil {
				if err := w.fields(sub.dir, sub.owner, sub.imports, sub.st, prefix+name+sub.suffix, "", out, depth+1); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// nested is a struct a field's type holds, listed under the field.
type nested struct {
	dir     string
	owner   string // package.Type of the struct ("" for an anonymous one)
	imports map[string]string
	st      *ast.StructType
	suffix  string // what joins the field's name and the struct's: ".", "[].", ".KEY."
}

// jsonType names the JSON type of e, and the struct it holds, if any.
func (w *structWalker) jsonType(dir string, imports map[string]string, e ast.Expr) (string, *nested, error) {
	switch e := e.(type) {
	case *ast.StarExpr:
		return w.jsonType(dir, imports, e.X)
	case *ast.ArrayType:
		if id, ok := e.Elt.(*ast.Ident); ok && id.Name == "byte" {
			return "string (base64)", nil, nil
		}
		elem, sub, err := w.jsonType(dir, imports, e.Elt)
		if sub != nil {
			sub.suffix = "[]" + sub.suffix
		}
		return "array of " + elem, sub, err
	case *ast.MapType:
		elem, sub, err := w.jsonType(dir, imports, e.Value)
		if sub != nil {
			sub.suffix = ".KEY" + sub.suffix
		}
		return "object of " + elem, sub, err
	case *ast.InterfaceType:
		return "any JSON value", nil, nil
	case *ast.Ident:
		switch e.Name {
		case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
			return "integer", nil, nil
		case "float32", "float64":
			return "number", nil, nil
		case "string":
			return "string", nil, nil
		case "bool":
			return "boolean", nil, nil
		case "any":
			return "any JSON value", nil, nil
		}
		return w.named(dir, e.Name)
	case *ast.SelectorExpr:
		pkgIdent, ok := e.X.(*ast.Ident)
		if !ok {
			return "", nil, fmt.Errorf("unsupported type expression %T", e.X)
		}
		path := imports[pkgIdent.Name]
		switch path + "." + e.Sel.Name {
		case "time.Duration":
			return "integer (nanoseconds)", nil, nil
		case "time.Time":
			return "string (RFC 3339 time)", nil, nil
		case "encoding/json.RawMessage":
			return "any JSON value", nil, nil
		}
		rel, ok := strings.CutPrefix(path, w.module+"/")
		if !ok {
			return "", nil, fmt.Errorf("type %s.%s is outside module %s", path, e.Sel.Name, w.module)
		}
		return w.named(rel, e.Sel.Name)
	case *ast.StructType:
		return "object", &nested{dir: dir, owner: "", imports: imports, st: e, suffix: "."}, nil
	}
	return "", nil, fmt.Errorf("unsupported type expression %T", e)
}

// named is jsonType of the named type name of package dir.
func (w *structWalker) named(dir, name string) (string, *nested, error) {
	t, err := w.lookup(dir, name)
	if err != nil {
		return "", nil, err
	}
	if st, ok := t.expr.(*ast.StructType); ok {
		return "object", &nested{dir: dir, owner: filepath.Base(dir) + "." + name, imports: t.imports, st: st, suffix: "."}, nil
	}
	return w.jsonType(dir, t.imports, t.expr)
}

// resolveStruct resolves an embedded field's type to its struct, if it is one.
func (w *structWalker) resolveStruct(dir string, imports map[string]string, e ast.Expr) (string, string, map[string]string, *ast.StructType, bool, error) {
	if s, ok := e.(*ast.StarExpr); ok {
		e = s.X
	}
	var tdir, name string
	switch e := e.(type) {
	case *ast.Ident:
		tdir, name = dir, e.Name
	case *ast.SelectorExpr:
		id, ok := e.X.(*ast.Ident)
		if !ok {
			return "", "", nil, nil, false, nil
		}
		rel, ok := strings.CutPrefix(imports[id.Name], w.module+"/")
		if !ok {
			return "", "", nil, nil, false, nil
		}
		tdir, name = rel, e.Sel.Name
	default:
		return "", "", nil, nil, false, nil
	}
	t, err := w.lookup(tdir, name)
	if err != nil {
		return "", "", nil, nil, false, err
	}
	st, ok := t.expr.(*ast.StructType)
	return tdir, filepath.Base(tdir) + "." + name, t.imports, st, ok, nil
}

// mentions reports whether doc names the Go identifier name as a word.
func mentions(doc, name string) bool {
	for _, w := range strings.FieldsFunc(doc, func(r rune) bool {
		return !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
	}) {
		if w == name {
			return true
		}
	}
	return false
}
