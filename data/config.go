package data

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// File splits of a dataset folder.
const (
	FileTrain = "train" // training questions; validation questions are held out of them
	FileTest  = "test"  // evaluation questions
)

// extensions are tried in this order when looking for <dataset>/<split>.
var extensions = []string{".jsonl", ".parquet", ".json"}

// Config selects the QA data of a run. It is the [data] table of recal.toml.
type Config struct {
	Dir            string            `toml:"dir"`              // root folder holding <dataset>/<split>.jsonl, .parquet or .json; relative paths are resolved against the config file's folder by the caller
	Train          []string          `toml:"train"`            // datasets trained on, by name or split ("id", "ood", "all"), e.g. ["nq", "hotpotqa"]
	Test           []string          `toml:"test"`             // datasets evaluated, by name or split; default ["all"]
	Files          map[string]string `toml:"files"`            // optional explicit files keyed "<dataset>/<split>" (split "train" or "test"), e.g. "hotpotqa/test" = "hotpotqa/dev.jsonl"; relative paths are resolved against Dir
	ForceDataset   bool              `toml:"force_dataset"`    // label every row of a file with the dataset it was found for, ignoring the rows' data_source/dataset fields
	TestPerDataset int               `toml:"test_per_dataset"` // questions evaluated per dataset, sampled with Seed in file order; 0 keeps all (default 500)
	ValPerDataset  int               `toml:"val_per_dataset"`  // questions per training dataset held out of training for validation, sampled with Seed; 0 for none (default 100)
	// TrainPerDataset caps the training questions of each dataset (after the
	// validation hold-out), sampled with Seed; 0 keeps all. Equal caps give
	// a balanced mix, as the paper's 7K NQ + 7K HotpotQA.
	TrainPerDataset int   `toml:"train_per_dataset"`
	Seed            int64 `toml:"seed"` // seed of the test and validation samples and of the training shuffle
}

// DefaultConfig returns the defaults: the vendored data under data/qa,
// training on the in-domain datasets (nq, hotpotqa) and testing on all seven
// with 500 questions each.
func DefaultConfig() Config {
	return Config{
		Dir:            filepath.Join("data", "qa"),
		Train:          []string{SplitInDomain},
		Test:           []string{SplitAll},
		TestPerDataset: 500,
		ValPerDataset:  100,
	}
}

// Validate checks the config, naming the bad key.
func (c Config) Validate() error {
	bad := func(key, format string, args ...any) error {
		return fmt.Errorf("data: config key %q: %s", "data."+key, fmt.Sprintf(format, args...))
	}
	train, err := expand(c.Train)
	if err != nil {
		return bad("train", "%v", err)
	}
	if len(train) == 0 {
		return bad("train", "no dataset")
	}
	test, err := expand(c.Test)
	if err != nil {
		return bad("test", "%v", err)
	}
	keys := make([]string, 0, len(c.Files))
	for k := range c.Files {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ds, split, ok := strings.Cut(k, "/")
		if !ok || (split != FileTrain && split != FileTest) {
			return bad("files", "key %q: want \"<dataset>/train\" or \"<dataset>/test\"", k)
		}
		if canon, err := canonical(ds); err != nil {
			return bad("files", "key %q: %v", k, err)
		} else if canon != ds {
			return bad("files", "key %q: use the canonical name %q", k, canon+"/"+split)
		}
		if strings.TrimSpace(c.Files[k]) == "" {
			return bad("files", "key %q: empty path", k)
		}
	}
	if c.Dir == "" {
		var needed []string
		for _, ds := range train {
			needed = append(needed, ds+"/"+FileTrain)
		}
		for _, ds := range test {
			needed = append(needed, ds+"/"+FileTest)
		}
		for _, k := range needed {
			if _, ok := c.Files[k]; !ok {
				return bad("dir", "empty, and files has no %q", k)
			}
		}
	}
	if c.TestPerDataset < 0 {
		return bad("test_per_dataset", "%d is negative (0 keeps all)", c.TestPerDataset)
	}
	if c.TrainPerDataset < 0 {
		return bad("train_per_dataset", "%d is negative", c.TrainPerDataset)
	}
	if c.ValPerDataset < 0 {
		return bad("val_per_dataset", "%d is negative", c.ValPerDataset)
	}
	return nil
}

// Path returns the file of a dataset's split ("train" or "test"): the
// entry of Files if there is one (relative to Dir), else the first of
// Dir/<dataset>/<split>.jsonl, .parquet and .json that exists.
func (c Config) Path(dataset, split string) (string, error) {
	ds, err := Canonical(dataset)
	if err != nil {
		return "", err
	}
	if p, ok := c.Files[ds+"/"+split]; ok {
		if !filepath.IsAbs(p) {
			p = filepath.Join(c.Dir, p)
		}
		return p, nil
	}
	base := filepath.Join(c.Dir, ds, split)
	for _, ext := range extensions {
		if _, err := os.Stat(base + ext); err == nil {
			return base + ext, nil
		}
	}
	return "", fmt.Errorf("data: no %s file for %s: tried %s{%s} (set files.%q to name one)",
		split, ds, base, strings.Join(extensions, ","), ds+"/"+split)
}

// load reads the split of one dataset.
func (c Config) load(ds, split string) ([]Example, error) {
	path, err := c.Path(ds, split)
	if err != nil {
		return nil, err
	}
	return LoadFile(path, LoadOptions{Dataset: ds, Force: c.ForceDataset})
}

// LoadTrain loads the training files of the Train datasets and splits each
// into validation questions (ValPerDataset of them, sampled with Seed under
// the label "val/<dataset>", in file order) and training questions (the
// rest, in file order). The two never share a question. Feed train to
// NewSampler. Examples come dataset by dataset, in the order of Train.
func (c Config) LoadTrain() (train, val []Example, err error) {
	if err := c.Validate(); err != nil {
		return nil, nil, err
	}
	datasets, _ := Expand(c.Train)
	for _, ds := range datasets {
		all, err := c.load(ds, FileTrain)
		if err != nil {
			return nil, nil, err
		}
		if c.ValPerDataset >= len(all) {
			return nil, nil, fmt.Errorf("data: config key %q: %d held out of %d %s training questions leaves none to train on",
				"val_per_dataset", c.ValPerDataset, len(all), ds)
		}
		held := make(map[string]bool, c.ValPerDataset)
		if c.ValPerDataset > 0 {
			for _, ex := range Sample(all, c.ValPerDataset, c.Seed, "val/"+ds) {
				held[ex.ID] = true
				val = append(val, ex)
			}
		}
		var rest []Example
		for _, ex := range all {
			if !held[ex.ID] {
				rest = append(rest, ex)
			}
		}
		if c.TrainPerDataset > 0 && len(rest) > c.TrainPerDataset {
			rest = Sample(rest, c.TrainPerDataset, c.Seed, "train/"+ds)
		}
		train = append(train, rest...)
	}
	return train, val, nil
}

// LoadTest loads the test files of the Test datasets and keeps up to
// TestPerDataset questions of each (see SampleTest). Examples come dataset
// by dataset, in the order of Test, each in file order.
func (c Config) LoadTest() ([]Example, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	datasets, _ := Expand(c.Test)
	var out []Example
	for _, ds := range datasets {
		all, err := c.load(ds, FileTest)
		if err != nil {
			return nil, err
		}
		out = append(out, SampleTest(all, c.TestPerDataset, c.Seed)...)
	}
	return out, nil
}

// InDomain returns the datasets trained on (Train, expanded): the
// in-domain datasets of this configuration. The rest of a table's datasets
// are out of domain.
func (c Config) InDomain() []string {
	out, _ := expand(c.Train)
	return out
}

// TestSplit returns the datasets of a split of this configuration's test
// datasets (Test, expanded, in that order): "all" is every one of them,
// "id" those also trained on (Train), "ood" the others. A split with no
// dataset is an error naming Test and Train.
func (c Config) TestSplit(name string) ([]string, error) {
	test, err := expand(c.Test)
	if err != nil {
		return nil, fmt.Errorf("data: config key %q: %w", "data.test", err)
	}
	train, err := expand(c.Train)
	if err != nil {
		return nil, fmt.Errorf("data: config key %q: %w", "data.train", err)
	}
	var out []string
	for _, ds := range test {
		in := false
		for _, t := range train {
			in = in || t == ds
		}
		switch name {
		case SplitAll:
			out = append(out, ds)
		case SplitInDomain:
			if in {
				out = append(out, ds)
			}
		case SplitOutOfDomain:
			if !in {
				out = append(out, ds)
			}
		default:
			return nil, fmt.Errorf("data: %w %q (known: %s, %s, %s)", ErrUnknownSplit, name, SplitInDomain, SplitOutOfDomain, SplitAll)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("data: split %q has no dataset: data.test is %s and data.train (the in-domain datasets) %s",
			name, strings.Join(test, ", "), strings.Join(train, ", "))
	}
	return out, nil
}
