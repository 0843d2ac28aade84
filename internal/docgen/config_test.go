package docgen

import (
	"bytes"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/llmpool"
)

// fixture is a configuration of every shape the page renders.
type fixture struct {
	// Name is a top-level key.
	Name  string       `toml:"name"`
	Table fixtureTable `toml:"table"`
	// Items are entries of an array of tables.
	Items []fixtureItem `toml:"items"`
}

// fixtureTable is the [table] table.
type fixtureTable struct {
	Wait    time.Duration      `toml:"wait"`    // Wait is a duration.
	Weights map[string]float64 `toml:"weights"` // Weights is a table of floats.
	// Hidden is not a key.
	Hidden int `toml:"-"`
	// Seed is optional.
	Seed *int64 `toml:"seed"`
}

// fixtureItem is one [[items]] entry.
type fixtureItem struct {
	// Name names the entry.
	Name string `toml:"name"`
	// Size is a number.
	Size int `toml:"size"`
	// Sim is a variant table.
	Sim *fixtureSim `toml:"sim"`
}

// fixtureSim is [items.sim].
type fixtureSim struct {
	// Rate is a float.
	Rate float64 `toml:"rate"`
}

// badFixture has keys and a table without doc comments.
type badFixture struct {
	// Fine is documented.
	Fine   int          `toml:"fine"`
	Bare   int          `toml:"bare"`
	Nested badFixtureIn `toml:"nested"`
}

type badFixtureIn struct {
	// Inner is documented.
	Inner int `toml:"inner"`
}

func fixturePage(t *testing.T) (string, []string) {
	t.Helper()
	seed := int64(7)
	var patterns []string
	p := ConfigPage{
		Root:     "../..",
		Default:  fixture{Name: "x", Table: fixtureTable{Wait: 1500 * time.Millisecond}},
		Elements: map[string]any{"items": fixtureItem{Size: 3, Sim: &fixtureSim{Rate: 0.5}}},
		Columns: []Column{
			{Label: "file", About: "a file.", Value: fixture{
				Name:  "y|z",
				Table: fixtureTable{Wait: time.Minute, Weights: map[string]float64{"b c": 2, "a": 1}, Seed: &seed},
				Items: []fixtureItem{{Name: "a", Size: 1, Sim: &fixtureSim{Rate: 0.5}}, {Name: "b", Size: 2, Sim: &fixtureSim{Rate: 0.5}}, {Name: "c", Size: 2}},
			}},
			{Label: "bare", About: "no entries.", Value: fixture{}},
		},
		Resumable: func(p string) bool {
			patterns = append(patterns, p)
			return p == "items[*].size"
		},
		Regenerate: "make docs",
	}
	b, err := p.Markdown()
	if err != nil {
		t.Fatalf("Markdown: %v", err)
	}
	return string(b), patterns
}

// TestConfigPageRendersEveryShape checks the rows of keys of each kind: a
// reader must find the right default and file value for each.
func TestConfigPageRendersEveryShape(t *testing.T) {
	page, patterns := fixturePage(t)
	for _, tc := range []struct{ name, want string }{
		{"top-level key", "### `name`\n\nName is a top-level key.\n\n| type | default | file | bare | resume |\n| --- | --- | --- | --- | --- |"},
		{"a | in a value is escaped in its cell", "| string | `\"x\"` | `\"y\\|z\"` | `\"\"` | no |"},
		{"durations as recal's files write them", "| duration | `\"1500ms\"` | `\"60s\"` | `\"0s\"` | no |"},
		{"a map, keys sorted and quoted where needed", "| table of float | `{}` | `{ a = 1.0, \"b c\" = 2.0 }` | `{}` | no |"},
		{"an optional value", "| integer (optional) | `unset` | `7` | `unset` | no |"},
		{"the array of tables' own row: its entries' names", "## `[[items]]`\n\nItems are entries of an array of tables.\n\nfixtureItem is one \\[\\[items]] entry.\n\n| type | default | file | bare | resume |\n| --- | --- | --- | --- | --- |\n| array of tables | `[]` | `[\"a\", \"b\", \"c\"]` | `[]` | no |"},
		{"entry values grouped by value, default from the template", "### `items[].size`\n\nSize is a number.\n\n| type | default | file | bare | resume |\n| --- | --- | --- | --- | --- |\n| integer | `3` | `1` (a)<br>`2` (b, c) | — | yes |"},
		{"a variant table some entries lack", "## `[items.sim]`"},
		{"a value every entry that has the table shares", "| float | `0.5` | `0.5` (a, b) | — | no |"},
		{"the table list links each table", "- [`[[items]]`](#items)\n- [`[items.sim]`](#itemssim)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(page, tc.want) {
				t.Errorf("the page lacks\n%s\n\npage:\n%s", tc.want, page)
			}
		})
	}
	if strings.Contains(page, "hidden") || strings.Contains(page, "Hidden") {
		t.Errorf("a toml:\"-\" field is on the page; it is not a key:\n%s", page)
	}
	// The resume rule is asked in the trainer's patterns.
	sort.Strings(patterns)
	want := []string{"items", "items[*].name", "items[*].sim.rate", "items[*].size", "name", "table.seed", "table.wait", "table.weights.*"}
	if !slices.Equal(patterns, want) {
		t.Errorf("Resumable was asked %q, want %q (the trainer's patterns: [*] for entries, .* for a map's keys)", patterns, want)
	}
}

// TestConfigPageRefusesUndocumented: the page is made from doc comments, so
// a key or table without one must stop the generator, naming each.
func TestConfigPageRefusesUndocumented(t *testing.T) {
	_, err := ConfigPage{Root: "../..", Default: badFixture{}}.Markdown()
	if err == nil {
		t.Fatal("Markdown accepted a key without a doc comment; it must name it")
	}
	for _, want := range []string{"badFixture.Bare (bare)", "badFixtureIn (table nested)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if strings.Contains(err.Error(), "Fine") || strings.Contains(err.Error(), "Inner") {
		t.Errorf("error %q names a documented field", err)
	}
}

// TestConfigPageListsEveryKey renders the real configuration and checks
// that every key its TOML encoding holds (the offline default and the
// paper's file, whose pools use both providers) has a heading.
func TestConfigPageListsEveryKey(t *testing.T) {
	entry := llmpool.Config{Models: []llmpool.ModelConfig{{OpenAI: &llmpool.OpenAIConfig{}, Sim: &llmpool.SimConfig{}}}}
	entry.SetDefaults()
	var cols []Column
	var keys []string
	for _, path := range []string{"../../recal.toml", "../../configs/qwen2.5-3b-nim.toml"} {
		cfg, err := config.Load(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		cols = append(cols, Column{Label: path, Value: cfg})
		var buf bytes.Buffer
		if err := toml.NewEncoder(&buf).Encode(cfg); err != nil {
			t.Fatal(err)
		}
		tree := map[string]any{}
		if _, err := toml.Decode(buf.String(), &tree); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, leafKeys(tree, "")...)
	}
	b, err := ConfigPage{Root: "../..", Default: config.Default(), Elements: map[string]any{"pool.models": entry.Models[0]}, Columns: cols}.Markdown()
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	for _, k := range keys {
		if !strings.Contains(page, "\n### `"+k+"`\n") {
			t.Errorf("key %s (in the encoded configuration) has no heading on the page", k)
		}
	}
	if len(keys) < 100 {
		t.Errorf("only %d keys encoded; the walk of the configuration is broken", len(keys))
	}
}

// leafKeys lists a decoded TOML tree's keys as the page names them: "[]"
// for an array of tables, a map (sim.accuracy, openai.extra) as one key.
func leafKeys(tree map[string]any, prefix string) []string {
	var out []string
	for k, v := range tree {
		switch v := v.(type) {
		case map[string]any:
			if strings.HasSuffix(prefix, ".sim.") && k == "accuracy" || k == "extra" || prefix == "data." && k == "files" {
				out = append(out, prefix+k)
				continue
			}
			out = append(out, leafKeys(v, prefix+k+".")...)
		case []map[string]any:
			for _, e := range v {
				out = append(out, leafKeys(e, prefix+k+"[].")...)
			}
		default:
			out = append(out, prefix+k)
		}
	}
	return out
}
