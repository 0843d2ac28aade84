package data

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// vendoredConfig is DefaultConfig pointed at the vendored data from this
// package's folder.
func vendoredConfig() Config {
	c := DefaultConfig()
	c.Dir = "qa"
	return c
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Config)
		want   string // "" for valid
	}{
		{"defaults", func(c *Config) {}, ""},
		{"splits and aliases", func(c *Config) { c.Train = []string{"id", "2wikimultihopqa"}; c.Test = []string{"ood"} }, ""},
		{"no test", func(c *Config) { c.Test = nil }, ""},
		{"unknown train dataset", func(c *Config) { c.Train = []string{"nq", "squad"} },
			`data: config key "data.train": unknown dataset "squad" (known: nq, triviaqa, popqa, hotpotqa, 2wiki, musique, bamboogle)`},
		{"empty train", func(c *Config) { c.Train = nil }, `data: config key "data.train": no dataset`},
		{"unknown test dataset", func(c *Config) { c.Test = []string{"webq"} }, `data: config key "data.test": unknown dataset "webq"`},
		{"files key without split", func(c *Config) { c.Files = map[string]string{"nq": "x.jsonl"} }, `data: config key "data.files": key "nq": want "<dataset>/train" or "<dataset>/test"`},
		{"files key with dev split", func(c *Config) { c.Files = map[string]string{"nq/dev": "x.jsonl"} }, `data: config key "data.files": key "nq/dev"`},
		{"files key unknown dataset", func(c *Config) { c.Files = map[string]string{"squad/test": "x.jsonl"} }, `data: config key "data.files": key "squad/test": unknown dataset`},
		{"files key alias", func(c *Config) { c.Files = map[string]string{"2wikimultihopqa/test": "x.jsonl"} }, `data: config key "data.files": key "2wikimultihopqa/test": use the canonical name "2wiki/test"`},
		{"files empty path", func(c *Config) { c.Files = map[string]string{"nq/test": " "} }, `data: config key "data.files": key "nq/test": empty path`},
		{"no dir", func(c *Config) { c.Dir = "" }, `data: config key "data.dir": empty, and files has no "nq/train"`},
		{"no dir, files cover all", func(c *Config) {
			c.Dir, c.Test = "", []string{"nq"}
			c.Files = map[string]string{"nq/train": "a.jsonl", "hotpotqa/train": "b.jsonl", "nq/test": "c.jsonl"}
		}, ""},
		{"negative test_per_dataset", func(c *Config) { c.TestPerDataset = -1 }, `data: config key "data.test_per_dataset": -1 is negative`},
		{"negative val_per_dataset", func(c *Config) { c.ValPerDataset = -5 }, `data: config key "data.val_per_dataset": -5 is negative`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := vendoredConfig()
			tt.change(&c)
			err := c.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tt.want)):
				t.Errorf("Validate() = %v\nwant prefix %q (the bad key must be named)", err, tt.want)
			}
		})
	}
}

func TestConfigLoadTest(t *testing.T) {
	c := vendoredConfig()
	got, err := c.LoadTest()
	if err != nil {
		t.Fatalf("LoadTest: %v", err)
	}
	counts := make(map[string]int)
	var order []string
	for _, ex := range got {
		if counts[ex.Dataset] == 0 {
			order = append(order, ex.Dataset)
		}
		counts[ex.Dataset]++
	}
	want := map[string]int{"nq": 500, "triviaqa": 500, "popqa": 500, "hotpotqa": 500, "2wiki": 500, "musique": 500, "bamboogle": 125}
	if !reflect.DeepEqual(counts, want) {
		t.Errorf("test questions per dataset = %v, want %v (docs/method.md: 500 each, Bamboogle 125)", counts, want)
	}
	if !reflect.DeepEqual(order, Known()) {
		t.Errorf("datasets come in order %v, want %v", order, Known())
	}

	c.TestPerDataset, c.Test = 50, []string{"bamboogle", "nq"}
	small, err := c.LoadTest()
	if err != nil {
		t.Fatal(err)
	}
	if len(small) != 100 || small[0].Dataset != "bamboogle" || small[99].Dataset != "nq" {
		t.Errorf("50 each of [bamboogle nq]: %d examples, first %s, last %s; want 100, bamboogle first", len(small), small[0].Dataset, small[len(small)-1].Dataset)
	}
	c.Seed = 1
	other, _ := c.LoadTest()
	if reflect.DeepEqual(ids(other), ids(small)) {
		t.Error("seeds 0 and 1 sample the same test questions; want the seed to matter")
	}
}

func TestConfigLoadTrain(t *testing.T) {
	c := vendoredConfig()
	train, val, err := c.LoadTrain()
	if err != nil {
		t.Fatalf("LoadTrain: %v", err)
	}
	// SOURCES.md: nq train 3569, hotpotqa train 741; 100 of each held out.
	if len(val) != 200 || len(train) != 3569+741-200 {
		t.Errorf("train %d, val %d; want %d and 200", len(train), len(val), 3569+741-200)
	}
	inTrain := make(map[string]bool, len(train))
	for _, ex := range train {
		inTrain[ex.ID] = true
	}
	for _, ex := range val {
		if inTrain[ex.ID] {
			t.Fatalf("%s is both a training and a validation question; want disjoint sets", ex.ID)
		}
	}
	by := GroupByDataset(val)
	if len(by["nq"]) != 100 || len(by["hotpotqa"]) != 100 {
		t.Errorf("validation has %d nq and %d hotpotqa, want 100 each", len(by["nq"]), len(by["hotpotqa"]))
	}
	train2, val2, _ := c.LoadTrain()
	if !reflect.DeepEqual(ids(val2), ids(val)) || !reflect.DeepEqual(ids(train2), ids(train)) {
		t.Error("LoadTrain twice gave other splits; want a deterministic hold-out")
	}

	c.ValPerDataset = 741
	if _, _, err := c.LoadTrain(); err == nil || !strings.Contains(err.Error(), `"val_per_dataset": 741 held out of 741 hotpotqa`) {
		t.Errorf("holding out every hotpotqa question: error %v; want one naming val_per_dataset", err)
	}
	c.ValPerDataset = 0
	train, val, err = c.LoadTrain()
	if err != nil || len(val) != 0 || len(train) != 3569+741 {
		t.Errorf("val_per_dataset 0: train %d, val %d, %v; want all %d for training", len(train), len(val), err, 3569+741)
	}
}

// TestConfigFiles points a config at FlashRAG-style folders: no dataset
// field in the rows, the test questions in dev.jsonl, one file in Parquet.
func TestConfigFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(rel, content string) {
		t.Helper()
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("hotpotqa/dev.jsonl", `{"id": "5a8b57f25542995d1e6f1371", "question": "Were Scott Derrickson and Ed Wood of the same nationality?", "golden_answers": ["yes"]}`+"\n")
	write("nq/train.jsonl", `{"id": "train_0", "question": "total number of death row inmates in the us", "golden_answers": ["2,718"]}`+"\n"+
		`{"id": "train_1", "question": "big little lies season 2 how many episodes", "golden_answers": ["seven"]}`+"\n")
	parquetBytes, err := os.ReadFile(filepath.Join("testdata", "flashrag_element.parquet"))
	if err != nil {
		t.Fatal(err)
	}
	write("nq/test.parquet", string(parquetBytes))

	c := Config{
		Dir:            dir,
		Train:          []string{"nq"},
		Test:           []string{"nq", "hotpotqa"},
		Files:          map[string]string{"hotpotqa/test": "hotpotqa/dev.jsonl"},
		TestPerDataset: 500,
		ValPerDataset:  1,
	}
	if p, err := c.Path("nq", FileTest); err != nil || p != filepath.Join(dir, "nq", "test.parquet") {
		t.Errorf("Path(nq, test) = %q, %v; want the .parquet file found in Dir", p, err)
	}
	test, err := c.LoadTest()
	if err != nil {
		t.Fatalf("LoadTest: %v", err)
	}
	if got := ids(test); !reflect.DeepEqual(got, []string{"nq/test_0", "nq/test_1", "nq/test_2", "hotpotqa/5a8b57f25542995d1e6f1371"}) {
		t.Errorf("test ids = %v; want the Parquet nq rows, then hotpotqa from files.\"hotpotqa/test\"", got)
	}
	train, val, err := c.LoadTrain()
	if err != nil || len(train) != 1 || len(val) != 1 {
		t.Errorf("LoadTrain: train %d, val %d, %v; want 1 and 1", len(train), len(val), err)
	}

	c.Test = []string{"popqa"}
	if _, err := c.LoadTest(); err == nil || !strings.Contains(err.Error(), `no test file for popqa`) || !strings.Contains(err.Error(), `files."popqa/test"`) {
		t.Errorf("missing popqa test file: error %v; want one naming the paths tried and the files key", err)
	}
	if _, err := c.Path("squad", FileTest); !errors.Is(err, ErrUnknownDataset) {
		t.Errorf("Path(squad) error = %v, want ErrUnknownDataset", err)
	}
}

// TestSplit's id and ood come from the configuration's data.train, not
// from the paper's registry; "all" is data.test.
func TestConfigTestSplit(t *testing.T) {
	tests := []struct {
		name         string
		train, test  []string
		split        string
		want         []string
		wantInDomain []string
		err          string
	}{
		{"defaults all", []string{"id"}, []string{"all"}, "all",
			[]string{"nq", "triviaqa", "popqa", "hotpotqa", "2wiki", "musique", "bamboogle"}, []string{"nq", "hotpotqa"}, ""},
		{"defaults id", []string{"id"}, []string{"all"}, "id", []string{"nq", "hotpotqa"}, []string{"nq", "hotpotqa"}, ""},
		{"defaults ood", []string{"id"}, []string{"all"}, "ood",
			[]string{"triviaqa", "popqa", "2wiki", "musique", "bamboogle"}, []string{"nq", "hotpotqa"}, ""},
		{"outcomes world all", []string{"nq"}, []string{"nq", "triviaqa"}, "all", []string{"nq", "triviaqa"}, []string{"nq"}, ""},
		{"outcomes world id", []string{"nq"}, []string{"nq", "triviaqa"}, "id", []string{"nq"}, []string{"nq"}, ""},
		{"outcomes world ood", []string{"nq"}, []string{"nq", "triviaqa"}, "ood", []string{"triviaqa"}, []string{"nq"}, ""},
		{"trained on a registry-ood dataset", []string{"popqa"}, []string{"nq", "popqa"}, "id", []string{"popqa"}, []string{"popqa"}, ""},
		{"test order kept", []string{"nq"}, []string{"triviaqa", "nq"}, "all", []string{"triviaqa", "nq"}, []string{"nq"}, ""},
		{"empty split", []string{"nq"}, []string{"nq"}, "ood", nil, []string{"nq"},
			`data: split "ood" has no dataset: data.test is nq and data.train (the in-domain datasets) nq`},
		{"unknown split", []string{"nq"}, []string{"nq"}, "dev", nil, []string{"nq"}, `data: unknown split "dev" (known: id, ood, all)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Train, c.Test = tt.train, tt.test
			got, err := c.TestSplit(tt.split)
			if tt.err != "" {
				if err == nil || err.Error() != tt.err {
					t.Fatalf("TestSplit(%q) error = %v, want %q", tt.split, err, tt.err)
				}
			} else if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("TestSplit(%q) = %v, %v; want %v", tt.split, got, err, tt.want)
			}
			if in := c.InDomain(); !reflect.DeepEqual(in, tt.wantInDomain) {
				t.Errorf("InDomain() = %v, want %v", in, tt.wantInDomain)
			}
		})
	}
}
