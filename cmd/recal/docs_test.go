package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/internal/docgen"
	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/trainer"
)

var updateDocs = flag.Bool("update", false, "rewrite docs/config.md and docs/cli.md from the code (TestDocs)")

// regenerateDocs rewrites the generated reference pages (make docs runs it).
const regenerateDocs = "go test ./cmd/recal -run TestDocs -update"

// TestDocs fails when a generated reference page differs from what the
// code generates: the page would tell users about keys, defaults or flags
// the code no longer has.
func TestDocs(t *testing.T) {
	pages := []struct {
		path string
		make func() ([]byte, error)
	}{
		{"../../docs/config.md", configReference},
		{"../../docs/cli.md", func() ([]byte, error) { return docgen.CLIMarkdown(newApp(), regenerateDocs), nil }},
	}
	for _, p := range pages {
		t.Run(filepath.Base(p.path), func(t *testing.T) {
			got, err := p.make()
			if err != nil {
				t.Fatalf("generating %s: %v", p.path, err)
			}
			if *updateDocs {
				if err := os.WriteFile(p.path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				t.Logf("wrote %s (%d bytes)", p.path, len(got))
				return
			}
			have, err := os.ReadFile(p.path)
			if err != nil {
				t.Fatalf("%v; run `%s` to write it", err, regenerateDocs)
			}
			if !bytes.Equal(have, got) {
				line, h, w := firstDiff(have, got)
				t.Errorf("%s is stale: line %d is\n\t%q\nbut the code generates\n\t%q\nrun `%s` (or make docs) to rewrite it, and commit the result",
					p.path, line, h, w, regenerateDocs)
			}
		})
	}
}

// firstDiff returns the first line (1-based) where a and b differ, and that
// line of each ("" past the end).
func firstDiff(a, b []byte) (int, string, string) {
	la, lb := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := 0; ; i++ {
		var x, y string
		if i < len(la) {
			x = la[i]
		}
		if i < len(lb) {
			y = lb[i]
		}
		if x != y || i >= len(la) || i >= len(lb) {
			return i + 1, x, y
		}
	}
}

// configReference generates docs/config.md: every key of config.Config with
// its default, the values of recal.toml and of the paper's configuration,
// and whether a resume may change it.
func configReference() ([]byte, error) {
	offline, err := parseConfigFile("../../recal.toml")
	if err != nil {
		return nil, err
	}
	paper, err := parseConfigFile("../../configs/qwen2.5-3b-nim.toml")
	if err != nil {
		return nil, err
	}
	// What a [[pool.models]] entry gets for the keys it leaves out (config.Parse
	// fills them with Pool.SetDefaults), both provider tables present.
	entry := llmpool.Config{Models: []llmpool.ModelConfig{{OpenAI: &llmpool.OpenAIConfig{}, Sim: &llmpool.SimConfig{}}}}
	entry.SetDefaults()
	return docgen.ConfigPage{
		Root:     "../..",
		Default:  config.Default(),
		Elements: map[string]any{"pool.models": entry.Models[0]},
		Columns: []docgen.Column{
			{Label: "recal.toml", About: "the offline default that `make train` runs (a tiny policy on a CPU, a simulated pool); keys the file leaves out at their defaults.", Value: offline},
			{Label: "paper", About: "`configs/qwen2.5-3b-nim.toml`, the ReCal paper's setting (Qwen2.5-3B-Instruct on a GPU, a pool of six models on NVIDIA NIM); keys the file leaves out at their defaults.", Value: paper},
		},
		Resumable:  trainer.OperationalKey,
		Regenerate: regenerateDocs,
	}.Markdown()
}

// parseConfigFile loads a configuration file as written: relative paths
// stay relative (Load would make them absolute, machine-dependent).
func parseConfigFile(path string) (config.Config, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return config.Config{}, err
	}
	return config.Parse(filepath.Base(path), text, nil)
}

// TestDocsMethodDefaults checks docs/method.md's table of defaults
// (section "Defaults") against the code: each row's "code default" column
// against config.Default() and its recal.toml column against recal.toml, so
// the method page never quotes a value the code or the offline default no
// longer has; and every [train] or [calibration] key that recal.toml sets
// away from its default, and that a resume may not change, has a row.
func TestDocsMethodDefaults(t *testing.T) {
	text, err := os.ReadFile("../../docs/method.md")
	if err != nil {
		t.Fatal(err)
	}
	rows, err := methodDefaultsRows(string(text))
	if err != nil {
		t.Fatalf("docs/method.md: %v", err)
	}
	offline, err := parseConfigFile("../../recal.toml")
	if err != nil {
		t.Fatal(err)
	}
	columns := []struct {
		name string
		tree map[string]any
	}{
		{"code default", configTree(t, config.Default())},
		{"recal.toml", configTree(t, offline)},
	}
	quoted := map[string]bool{}
	for _, r := range rows {
		t.Run(strings.Join(r.keys, ","), func(t *testing.T) {
			for ci, col := range columns {
				cellText := r.cells[ci]
				if cellText == "same" { // the row's code default
					cellText = r.cells[0]
				}
				vals := splitValues(cellText)
				if len(vals) != len(r.keys) {
					t.Fatalf("docs/method.md line %d: the %s column %q holds %d value(s) for %d key(s) %v; want one per key",
						r.line, col.name, r.cells[ci], len(vals), len(r.keys), r.keys)
				}
				for i, k := range r.keys {
					actual, ok := lookupKey(col.tree, k)
					if !ok {
						t.Errorf("docs/method.md line %d: key %s is not a configuration key", r.line, k)
						continue
					}
					if !sameValue(vals[i], actual) {
						t.Errorf("docs/method.md line %d: %s: the %s column says %s, but it is %v; correct the page",
							r.line, k, col.name, vals[i], actual)
					}
				}
			}
		})
		for _, k := range r.keys {
			quoted[k] = true
		}
	}
	// Every training key recal.toml changes, so that a reader of the method
	// page knows how the offline default departs from the paper's defaults.
	keys := flatKeys(columns[1].tree, "")
	sort.Strings(keys)
	for _, k := range keys {
		if !strings.HasPrefix(k, "train.") && !strings.HasPrefix(k, "calibration.") || trainer.OperationalKey(k) {
			continue
		}
		def, _ := lookupKey(columns[0].tree, k)
		off, _ := lookupKey(columns[1].tree, k)
		if fmt.Sprint(def) != fmt.Sprint(off) && !quoted[k] {
			t.Errorf("docs/method.md section \"Defaults\" has no row for %s (code default %v, recal.toml %v): the table should list every training key recal.toml changes", k, def, off)
		}
	}
}

// methodRow is one row of method.md's table of defaults.
type methodRow struct {
	line  int
	keys  []string  // full dotted keys
	cells [2]string // code default, recal.toml
}

var backticked = regexp.MustCompile("`([^`]+)`")

// methodDefaultsRows reads the table under "## 11. Defaults" (any section
// titled "Defaults"): columns key, code default, paper, recal.toml. A key
// cell names its keys in backticks; a key without a dot belongs to the
// table of the first one (`train.batch_size` × `group_size`).
func methodDefaultsRows(text string) ([]methodRow, error) {
	lines := strings.Split(text, "\n")
	start := -1
	for i, l := range lines {
		if strings.HasPrefix(l, "## ") && strings.HasSuffix(strings.TrimSpace(l), "Defaults") {
			start = i
			break
		}
	}
	if start < 0 {
		return nil, fmt.Errorf("no section titled \"Defaults\"")
	}
	var rows []methodRow
	header := false
	for i := start + 1; i < len(lines) && !strings.HasPrefix(lines[i], "## "); i++ {
		l := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(l, "|") {
			if header {
				break // the end of the table
			}
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		for j := range cells {
			cells[j] = strings.TrimSpace(cells[j])
		}
		if !header {
			want := []string{"key", "code default", "paper", "`recal.toml`"}
			if fmt.Sprint(cells) != fmt.Sprint(want) {
				return nil, fmt.Errorf("line %d: the table's columns are %q, want %q", i+1, cells, want)
			}
			header = true
			i++ // the --- row
			continue
		}
		if len(cells) != 4 {
			return nil, fmt.Errorf("line %d: %d cells, want 4", i+1, len(cells))
		}
		r := methodRow{line: i + 1, cells: [2]string{cells[1], cells[3]}}
		table := ""
		for _, m := range backticked.FindAllStringSubmatch(cells[0], -1) {
			k := m[1]
			if dot := strings.LastIndex(k, "."); dot >= 0 {
				table = k[:dot+1]
			} else {
				k = table + k
			}
			r.keys = append(r.keys, k)
		}
		if len(r.keys) == 0 || table == "" {
			return nil, fmt.Errorf("line %d: the key cell %q names no dotted key in backticks (the test checks every row)", i+1, cells[0])
		}
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("the \"Defaults\" section holds no table")
	}
	return rows, nil
}

// splitValues splits a cell of several values ("64 × 4", "0.8, 1.25").
func splitValues(cell string) []string {
	cell = strings.ReplaceAll(cell, "×", ",")
	var out []string
	for _, v := range strings.Split(cell, ",") {
		out = append(out, strings.Trim(strings.TrimSpace(v), "`"))
	}
	return out
}

// sameValue reports whether the page's text v states the value x.
func sameValue(v string, x any) bool {
	switch x := x.(type) {
	case int64:
		f, err := strconv.ParseFloat(v, 64)
		return err == nil && f == float64(x)
	case float64:
		f, err := strconv.ParseFloat(v, 64)
		return err == nil && f == x
	case bool:
		b, err := strconv.ParseBool(v)
		return err == nil && b == x
	case string:
		if s, err := strconv.Unquote(v); err == nil {
			v = s
		}
		return v == x
	}
	return fmt.Sprint(x) == v
}

// configTree is c as its TOML encoding decodes into maps.
func configTree(t *testing.T, c config.Config) map[string]any {
	t.Helper()
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(c); err != nil {
		t.Fatal(err)
	}
	tree := map[string]any{}
	if _, err := toml.Decode(buf.String(), &tree); err != nil {
		t.Fatal(err)
	}
	return tree
}

// lookupKey returns the value of a dotted key of tree.
func lookupKey(tree map[string]any, key string) (any, bool) {
	var cur any = tree
	for _, part := range strings.Split(key, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[part]; !ok {
			return nil, false
		}
	}
	return cur, true
}

// flatKeys lists the dotted keys of tree's leaves (tables of tables only;
// an array counts as one leaf).
func flatKeys(tree map[string]any, prefix string) []string {
	var out []string
	for k, v := range tree {
		if m, ok := v.(map[string]any); ok {
			out = append(out, flatKeys(m, prefix+k+".")...)
		} else {
			out = append(out, prefix+k)
		}
	}
	return out
}
