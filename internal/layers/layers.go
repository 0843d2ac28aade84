// Package layers reads the table of package layers in docs/development.md
// and checks a module's imports against it: a package imports only
// packages in layers below its own, or, within its layer, those an arrow
// of the table allows. The test of this package runs the check over the
// module, so the table and the code cannot drift apart.
//
// A layer's packages are written as a list of code spans separated by ","
// or ";". A span is an import path relative to the module ("router",
// "internal/rollout") or a pattern ending in "/..." that matches a folder
// and everything below it ("bench/..."); packages one pattern matches may
// import each other. Spans joined by "→" form a chain: a package may import
// those after it in its chain ("`experiments/table1` →
// `experiments/sftdirect`"). Test fixtures (Fixtures) are in no layer: they
// may import anything, and only test files import them.
package layers

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Fixtures is the folder of the test fixtures, relative to the module:
// packages below it are in no layer, may import any package, and may be
// imported only by test files.
const Fixtures = "internal/testing/"

// Header is the header row of the table Parse reads.
const Header = "| layer | packages |"

// ErrNoTable is returned by Parse when the text holds no table that starts
// with Header.
var ErrNoTable = errors.New("layers: no table headed " + Header)

// Layer is one row of the table.
type Layer struct {
	// Name is the row's first cell ("jobs").
	Name string
	// Chains are the row's packages: each chain is one package (or
	// pattern) or several joined by arrows, the first allowed to import
	// the others.
	Chains [][]string
}

// Package is one package of the module and what its non-test files import.
type Package struct {
	// Path is the import path relative to the module ("internal/rollout").
	Path string
	// Imports are the module's packages its non-test files import, as
	// relative paths; other imports are left out.
	Imports []string
}

// Violation is one import the layers forbid, or a package the table does
// not place.
type Violation struct {
	// Pkg is the package at fault (or, for a stale table entry, the entry).
	Pkg string
	// Import is the package it imports; empty when the fault is Pkg's place.
	Import string
	// Why says which rule it breaks.
	Why string
}

func (v Violation) String() string {
	if v.Import == "" {
		return v.Pkg + ": " + v.Why
	}
	return v.Pkg + " imports " + v.Import + ": " + v.Why
}

// Parse returns the layers of the first table in markdown whose header row
// is Header, top row first (the top layer imports the most).
func Parse(markdown []byte) ([]Layer, error) {
	var layers []Layer
	in, line := false, 0
	sc := bufio.NewScanner(bytes.NewReader(markdown))
	for sc.Scan() {
		line++
		s := strings.TrimSpace(sc.Text())
		if !in {
			if s == Header {
				in = true
			}
			continue
		}
		if !strings.HasPrefix(s, "|") {
			break
		}
		cells := strings.Split(strings.Trim(s, "|"), "|")
		if len(cells) != 2 {
			return nil, fmt.Errorf("layers: line %d: %d cells, want 2 (layer, packages)", line, len(cells))
		}
		name, pkgs := strings.TrimSpace(cells[0]), strings.TrimSpace(cells[1])
		if strings.Trim(name, "-: ") == "" {
			continue // the delimiter row
		}
		chains, err := parseCell(pkgs)
		if err != nil {
			return nil, fmt.Errorf("layers: line %d (%s): %w", line, name, err)
		}
		layers = append(layers, Layer{Name: name, Chains: chains})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("layers: %w", err)
	}
	if !in {
		return nil, ErrNoTable
	}
	if len(layers) == 0 {
		return nil, fmt.Errorf("layers: the table headed %s has no rows", Header)
	}
	return layers, nil
}

// parseCell reads "`a` → `b`, `c`; `d/...`" into [[a b] [c] [d/...]].
func parseCell(cell string) ([][]string, error) {
	var chains [][]string
	for _, item := range strings.FieldsFunc(cell, func(r rune) bool { return r == ',' || r == ';' }) {
		var chain []string
		for _, span := range strings.Split(item, "→") {
			span = strings.TrimSpace(span)
			if len(span) < 3 || span[0] != '`' || span[len(span)-1] != '`' || strings.Count(span, "`") != 2 {
				return nil, fmt.Errorf("%q is not a package in backquotes (the cell holds only packages, separated by \",\", \";\" or \"→\")", span)
			}
			chain = append(chain, span[1:len(span)-1])
		}
		chains = append(chains, chain)
	}
	if len(chains) == 0 {
		return nil, errors.New("no packages")
	}
	return chains, nil
}

// place is where the table puts a package: its layer (0 is the top), the
// chain and the position in it.
type place struct {
	layer, chain, pos int
}

// match reports whether pattern (a path or "dir/...") matches pkg.
func match(pattern, pkg string) bool {
	if dir, ok := strings.CutSuffix(pattern, "/..."); ok {
		return pkg == dir || strings.HasPrefix(pkg, dir+"/")
	}
	return pattern == pkg
}

// Check returns every violation of layers by pkgs, sorted: an import of a
// package in a higher layer, or in the same layer where no arrow allows
// it; a non-test import of a test fixture; a package in no layer or in
// two; and an entry of the table that matches no package.
func Check(layers []Layer, pkgs []Package) []Violation {
	var out []Violation
	places := map[string]place{}
	used := map[string]bool{}
	for _, p := range pkgs {
		if strings.HasPrefix(p.Path+"/", Fixtures) {
			continue
		}
		var found []place
		for li, l := range layers {
			for ci, chain := range l.Chains {
				for pi, pat := range chain {
					if match(pat, p.Path) {
						found = append(found, place{li, ci, pi})
						used[pat] = true
					}
				}
			}
		}
		switch len(found) {
		case 0:
			out = append(out, Violation{Pkg: p.Path, Why: "in no layer of the table; add it to the row of the layer it belongs to"})
		case 1:
			places[p.Path] = found[0]
		default:
			out = append(out, Violation{Pkg: p.Path, Why: fmt.Sprintf("in %d places of the table, want one", len(found))})
		}
	}
	for _, l := range layers {
		for _, chain := range l.Chains {
			for _, pat := range chain {
				if !used[pat] {
					out = append(out, Violation{Pkg: pat, Why: fmt.Sprintf("the table's layer %q names it, but the module has no such package", l.Name)})
				}
			}
		}
	}
	for _, p := range pkgs {
		fixture := strings.HasPrefix(p.Path+"/", Fixtures)
		from, placed := places[p.Path]
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp+"/", Fixtures) {
				if !fixture {
					out = append(out, Violation{Pkg: p.Path, Import: imp, Why: "a test fixture, which only test files may import"})
				}
				continue
			}
			to, ok := places[imp]
			if fixture || !placed || !ok {
				continue // fixtures import anything; unplaced packages are reported above
			}
			if why := forbidden(layers, from, to, p.Path, imp); why != "" {
				out = append(out, Violation{Pkg: p.Path, Import: imp, Why: why})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// forbidden says why the package at from (path pkg) may not import the one
// at to (path imp), or returns "" when it may.
func forbidden(layers []Layer, from, to place, pkg, imp string) string {
	switch {
	case to.layer > from.layer:
		return ""
	case to.layer < from.layer:
		return fmt.Sprintf("layer %q is above %q", layers[to.layer].Name, layers[from.layer].Name)
	case from.chain == to.chain && to.pos > from.pos:
		return "" // an arrow allows it
	case from.chain == to.chain && to.pos == from.pos:
		return "" // one pattern ("dir/...") matches both
	}
	return fmt.Sprintf("both in layer %q, and no arrow of the table leads from %s to %s", layers[from.layer].Name, pkg, imp)
}
