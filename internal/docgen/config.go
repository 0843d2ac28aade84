package docgen

import (
	"encoding"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// ConfigPage is what docs/config.md is made from.
type ConfigPage struct {
	// Root is the module's root folder (holding go.mod); the doc comments
	// are read from the Go files of each package that defines a table.
	Root string
	// Default is the configuration every file starts from (config.Default()):
	// its type is walked for the keys, its values are the defaults.
	Default any
	// Elements holds, per array of tables (by key, "pool.models"), an entry
	// whose keys hold the values the loader gives keys an entry leaves out;
	// its variant tables (pool.models.openai, pool.models.sim) set, so that
	// their defaults show.
	Elements map[string]any
	// Columns are configuration files whose values are listed next to the
	// defaults, each of Default's type.
	Columns []Column
	// Resumable reports whether `recal train --resume` may change a key
	// without --allow-config-change. It gets the key as the trainer's
	// pattern: "[*]" for any entry of an array of tables
	// ("pool.models[*].sim.latency"), and an entry of a map as key.*
	// ("data.files.*").
	Resumable func(pattern string) bool
	// Regenerate is the command that rewrites the page.
	Regenerate string
}

// Column is one configuration file shown on the page.
type Column struct {
	Label string // the column's heading, e.g. "recal.toml"
	About string // what the file is, for the page's introduction
	Value any    // the file as loaded (defaults for the keys it leaves out)
}

// step is one move from a value towards a key: a struct field, or every
// entry of an array of tables (each, with the array's key).
type step struct {
	field int
	each  bool
	array string
}

// key is one TOML key of the page.
type key struct {
	name    string // dotted, "[]" after an array of tables: pool.models[].sim.latency
	pattern string // the trainer's: pool.models[*].sim.latency
	typ     string
	doc     string // Markdown
	steps   []step
	isMap   bool
}

// table is one TOML table: its keys, then its sub-tables come after it.
type table struct {
	name    string // dotted key of the table ("" for the top level)
	pattern string // the trainer's pattern of an array's key (its names and order)
	array   bool   // an array of tables ([[name]])
	doc     string // Markdown
	steps   []step // to the table's field (the slice, for an array)
	keys    []key
}

func (t table) header() string {
	switch {
	case t.name == "":
		return "top level"
	case t.array:
		return "[[" + t.name + "]]"
	}
	// An entry's sub-table: [pool.models.sim] in TOML, its keys pool.models[].sim.*.
	return "[" + strings.ReplaceAll(t.name, "[]", "") + "]"
}

var (
	durationType    = reflect.TypeFor[time.Duration]()
	unmarshalerType = reflect.TypeFor[toml.Unmarshaler]()
	textType        = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// isTable reports whether values of t are TOML tables with keys of their
// own (a struct the decoder fills field by field).
func isTable(t reflect.Type) bool {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t == reflect.TypeFor[time.Time]() {
		return false
	}
	p := reflect.PointerTo(t)
	return !p.Implements(unmarshalerType) && !p.Implements(textType)
}

// walker collects the tables and keys of a configuration type.
type walker struct {
	src          *sourceDocs
	tables       []*table
	undocumented []string
}

// walk adds tb, the table of struct type t, and then its sub-tables;
// pattern is tb's key as the trainer writes it.
func (w *walker) walk(t reflect.Type, tb *table, pattern string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	w.tables = append(w.tables, tb)
	subs, err := w.fields(t, tb, pattern, tb.steps)
	if err != nil {
		return err
	}
	for _, s := range subs {
		if err := s(); err != nil {
			return err
		}
	}
	return nil
}

// fields adds the keys of struct t to tb and returns, in field order, the
// walks of its sub-tables (which come after every key of tb).
func (w *walker) fields(t reflect.Type, tb *table, pattern string, steps []step) ([]func() error, error) {
	docs, err := w.src.lookup(t.PkgPath(), t.Name())
	if err != nil {
		return nil, err
	}
	join := func(a, b string) string {
		if a == "" {
			return b
		}
		return a + "." + b
	}
	var subs []func() error
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if name == "-" {
			continue
		}
		fsteps := append(slices.Clip(steps), step{field: i})
		if f.Anonymous && name == "" && isTable(f.Type) { // embedded: its keys are this table's
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			more, err := w.fields(ft, tb, pattern, fsteps)
			if err != nil {
				return nil, err
			}
			subs = append(subs, more...)
			continue
		}
		if name == "" {
			name = f.Name
		}
		full, pat := join(tb.name, name), join(pattern, name)
		doc := docs.fields[f.Name]
		ft := f.Type
		switch {
		case isTable(ft):
			sub := &table{name: full, steps: fsteps}
			subs = append(subs, func() error {
				d, err := w.tableDoc(ft, doc, full)
				sub.doc = d
				if err != nil {
					return err
				}
				return w.walk(ft, sub, pat)
			})
		case ft.Kind() == reflect.Slice && isTable(ft.Elem()):
			sub := &table{name: full, pattern: pat, array: true, steps: fsteps}
			subs = append(subs, func() error {
				d, err := w.tableDoc(ft.Elem(), doc, full)
				sub.doc = d
				if err != nil {
					return err
				}
				w.tables = append(w.tables, sub)
				// The entries' keys form a table of their own, named full[].
				entries := &table{name: full + "[]", steps: append(slices.Clip(fsteps), step{each: true, array: full})}
				return w.walkEntries(ft.Elem(), entries, pat+"[*]", sub)
			})
		default:
			if strings.TrimSpace(doc) == "" {
				w.undocumented = append(w.undocumented, fmt.Sprintf("%s.%s.%s (%s)", t.PkgPath(), t.Name(), f.Name, full))
			}
			k := key{name: full, pattern: pat, typ: typeName(ft), doc: markdown(doc), steps: fsteps, isMap: ft.Kind() == reflect.Map}
			tb.keys = append(tb.keys, k)
		}
	}
	return subs, nil
}

// walkEntries adds the keys of an array's entries to the array's own
// table (arr), and the entries' sub-tables after it.
func (w *walker) walkEntries(t reflect.Type, entries *table, pattern string, arr *table) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	subs, err := w.fields(t, entries, pattern, entries.steps)
	if err != nil {
		return err
	}
	arr.keys = append(arr.keys, entries.keys...)
	for _, s := range subs {
		if err := s(); err != nil {
			return err
		}
	}
	return nil
}

// tableDoc is the doc of a table: its field's doc comment, then its type's.
func (w *walker) tableDoc(t reflect.Type, fieldDoc, name string) (string, error) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	docs, err := w.src.lookup(t.PkgPath(), t.Name())
	if err != nil {
		return "", err
	}
	if strings.TrimSpace(docs.doc) == "" {
		w.undocumented = append(w.undocumented, fmt.Sprintf("%s.%s (table %s)", t.PkgPath(), t.Name(), name))
	}
	var parts []string
	for _, d := range []string{fieldDoc, docs.doc} {
		if strings.TrimSpace(d) != "" {
			parts = append(parts, markdown(d))
		}
	}
	return strings.Join(parts, "\n\n"), nil
}

// typeName names a key's TOML type for a reader.
func typeName(t reflect.Type) string {
	if t == durationType {
		return "duration"
	}
	switch t.Kind() {
	case reflect.Pointer:
		return typeName(t.Elem()) + " (optional)"
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "float"
	case reflect.Slice, reflect.Array:
		switch e := typeName(t.Elem()); e {
		case "string", "integer", "float", "boolean", "duration":
			return "array of " + e + "s"
		default:
			return "array of " + e
		}
	case reflect.Map:
		if t.Elem().Kind() == reflect.Interface {
			return "table of any values"
		}
		return "table of " + typeName(t.Elem())
	case reflect.Interface:
		return "any"
	}
	return t.String()
}

// Markdown renders docs/config.md: the introduction, a list of the tables,
// then each table with every key: its doc comment and a row of its type,
// default, the columns' values and whether a resume may change it. It fails
// on a key or table without a doc comment, naming every one.
func (p ConfigPage) Markdown() ([]byte, error) {
	src, err := newSourceDocs(p.Root)
	if err != nil {
		return nil, err
	}
	rt := reflect.TypeOf(p.Default)
	if rt == nil || !isTable(rt) {
		return nil, fmt.Errorf("docgen: the default configuration is a %v, want a struct", rt)
	}
	for _, c := range p.Columns {
		if reflect.TypeOf(c.Value) != rt {
			return nil, fmt.Errorf("docgen: column %s holds a %T, want a %v", c.Label, c.Value, rt)
		}
	}
	w := &walker{src: src}
	root := &table{}
	if err := w.walk(rt, root, ""); err != nil {
		return nil, err
	}
	if len(w.undocumented) > 0 {
		return nil, fmt.Errorf("docgen: %d key(s) or table(s) without a doc comment (the page is made from them; add one to each):\n  %s",
			len(w.undocumented), strings.Join(w.undocumented, "\n  "))
	}
	tables := slices.DeleteFunc(w.tables, func(t *table) bool { return t.name == "" && len(t.keys) == 0 })

	nkeys := 0
	for _, t := range tables {
		nkeys += len(t.keys)
	}
	var blocks []string
	add := func(format string, args ...any) { blocks = append(blocks, fmt.Sprintf(format, args...)) }
	add("# Configuration reference")
	add("<!-- Generated from the code by `%s`. Do not edit. -->", p.Regenerate)
	add("Every key of recal's configuration (%d keys in %d tables), generated from the typed configuration "+
		"(`config.Config` and the tables it embeds) and the doc comments of its fields. "+
		"Unknown keys are errors; any key can be overridden on the command line with `--set key=value`. "+
		"A test fails when this page is stale; `%s` rewrites it.", nkeys, len(tables), p.Regenerate)
	legend := []string{
		"- **type**: its TOML type; a duration is a string such as `\"30s\"` or `\"500ms\"`.",
		"- **default**: the value when no file sets it. Keys of an array of tables (`[]`) show what an entry that leaves them out gets.",
	}
	for _, c := range p.Columns {
		legend = append(legend, fmt.Sprintf("- **%s**: %s", c.Label, c.About))
	}
	legend = append(legend, "- **resume**: whether `recal train --resume` may change the key (yes), or refuses a change without `--allow-config-change` (no).")
	add("Each key's row gives:")
	add("%s", strings.Join(legend, "\n"))
	add("In an array of tables, a file's values are listed per entry (by name), grouped where entries share a value; — means the file has no such table.")
	add("## Tables")
	var toc []string
	for _, t := range tables {
		h := "`" + t.header() + "`"
		toc = append(toc, fmt.Sprintf("- [%s](#%s)", h, slug(h)))
	}
	add("%s", strings.Join(toc, "\n"))
	for _, t := range tables {
		add("## `%s`", t.header())
		if t.doc != "" {
			add("%s", t.doc)
		}
		if t.array {
			add("%s", p.row(t.steps, "array of tables", t.pattern))
		}
		for _, k := range t.keys {
			add("### `%s`", k.name)
			if k.doc != "" {
				add("%s", k.doc)
			}
			pattern := k.pattern
			if k.isMap {
				pattern += ".*"
			}
			add("%s", p.row(k.steps, k.typ, pattern))
		}
	}
	return []byte(strings.Join(blocks, "\n\n") + "\n"), nil
}

// row writes the table of one key's type, values and resume rule.
func (p ConfigPage) row(steps []step, typ, pattern string) string {
	head := []string{"type", "default"}
	cells := []string{escape(typ)}
	templates := p.Elements
	if templates == nil {
		templates = map[string]any{}
	}
	items, n := follow(reflect.ValueOf(p.Default), steps, templates)
	cells = append(cells, cell(items, n, true))
	for _, c := range p.Columns {
		head = append(head, escape(c.Label))
		items, n := follow(reflect.ValueOf(c.Value), steps, nil)
		cells = append(cells, cell(items, n, false))
	}
	head = append(head, "resume")
	resume := "no"
	if p.Resumable != nil && p.Resumable(pattern) {
		resume = "yes"
	}
	cells = append(cells, resume)
	return fmt.Sprintf("| %s |\n|%s\n| %s |", strings.Join(head, " | "), strings.Repeat(" --- |", len(head)), strings.Join(cells, " | "))
}
