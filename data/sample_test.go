package data

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
)

// synthetic returns n examples of dataset ds with ids ds/0 … ds/n-1.
func synthetic(ds string, n int) []Example {
	out := make([]Example, n)
	for i := range out {
		id := fmt.Sprint(i)
		out[i] = Example{ID: ds + "/" + id, SourceID: id, Dataset: ds, Question: "q" + id + "?", Golden: []string{"a"}}
	}
	return out
}

func ids(examples []Example) []string {
	out := make([]string, len(examples))
	for i, ex := range examples {
		out[i] = ex.ID
	}
	return out
}

func TestSampleIndexes(t *testing.T) {
	tests := []struct{ n, k, want int }{
		{10, 3, 3}, {10, 10, 10}, {10, 20, 10}, {1, 1, 1}, {1000, 500, 500},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d of %d", tt.k, tt.n), func(t *testing.T) {
			got := sampleIndexes(tt.n, tt.k, newRNG(1, "x"))
			if len(got) != tt.want {
				t.Fatalf("%d indexes, want %d", len(got), tt.want)
			}
			for i, v := range got {
				if v < 0 || v >= tt.n || (i > 0 && got[i-1] >= v) {
					t.Fatalf("indexes %v: want strictly increasing values in [0, %d) (file order, no repeats)", got, tt.n)
				}
			}
		})
	}
}

// TestSampleUniform is a coarse check that each item is drawn about equally
// often: a biased sampler would skew the test sets.
func TestSampleUniform(t *testing.T) {
	const n, k, trials = 10, 3, 20000
	counts := make([]int, n)
	for seed := range int64(trials) {
		for _, i := range sampleIndexes(n, k, newRNG(seed, "uniform")) {
			counts[i]++
		}
	}
	want := float64(trials * k / n)
	for i, c := range counts {
		if d := float64(c) - want; d > 0.05*want || d < -0.05*want {
			t.Errorf("item %d drawn %d times, want %.0f ± 5%% (counts %v)", i, c, want, counts)
		}
	}
}

// TestSampleStable pins a few draws, so that a change to the generator,
// which would silently change every test set and resumed run, fails here.
// The expected indexes were computed by an independent Python transcription
// of SplitMix64, Lemire's bounded draw and the partial Fisher–Yates shuffle.
func TestSampleStable(t *testing.T) {
	got := ids(Sample(synthetic("nq", 100), 5, 0, "test/nq"))
	want := []string{"nq/11", "nq/49", "nq/53", "nq/75", "nq/95"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Sample(100, 5, seed 0) = %v, want %v; if the generator changed on purpose, update this and say so: test sets change", got, want)
	}
}

func TestSampleTest(t *testing.T) {
	all := append(append(synthetic("nq", 600), synthetic("bamboogle", 125)...), synthetic("popqa", 600)...)
	got := SampleTest(all, 500, 42)
	by := GroupByDataset(got)
	for ds, want := range map[string]int{"nq": 500, "bamboogle": 125, "popqa": 500} {
		if len(by[ds]) != want {
			t.Errorf("%s: %d questions, want %d (up to 500 per dataset, all of Bamboogle)", ds, len(by[ds]), want)
		}
	}
	// File order is kept, datasets stay in their blocks.
	pos := make(map[string]int, len(all))
	for i, ex := range all {
		pos[ex.ID] = i
	}
	for i := 1; i < len(got); i++ {
		if pos[got[i-1].ID] >= pos[got[i].ID] {
			t.Fatalf("%s before %s: want file order kept", got[i-1].ID, got[i].ID)
		}
	}
	// Same seed, same ids; another seed, other ids; each dataset's sample
	// equals Sample under the label "test/<dataset>".
	if again := SampleTest(all, 500, 42); !reflect.DeepEqual(ids(again), ids(got)) {
		t.Error("SampleTest with the same seed gave other questions; want a deterministic test set")
	}
	if other := SampleTest(all, 500, 43); reflect.DeepEqual(ids(other), ids(got)) {
		t.Error("SampleTest with seeds 42 and 43 gave the same questions; want the seed to matter")
	}
	if want := ids(Sample(synthetic("nq", 600), 500, 42, "test/nq")); !reflect.DeepEqual(ids(by["nq"]), want) {
		t.Error("SampleTest's nq sample differs from Sample(..., \"test/nq\"); want one protocol")
	}
	if got := SampleTest(all, 0, 42); len(got) != len(all) {
		t.Errorf("perDataset 0 kept %d, want all %d", len(got), len(all))
	}
}

func TestSampler(t *testing.T) {
	examples := append(synthetic("nq", 70), synthetic("hotpotqa", 30)...)
	s, err := NewSampler(examples, 7)
	if err != nil {
		t.Fatal(err)
	}
	if s.Len() != 100 {
		t.Errorf("Len() = %d, want 100", s.Len())
	}
	// Each epoch is a permutation.
	for epoch := range 3 {
		got := ids(s.Next(100))
		slices.Sort(got)
		want := ids(examples)
		slices.Sort(want)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("epoch %d does not draw every example exactly once", epoch)
		}
	}
	if st := s.State(); st.Epoch != 2 || st.Pos != 100 {
		t.Errorf("after 3 full epochs state = %+v, want epoch 2, pos 100 (the next draw starts epoch 3)", st)
	}

	// Mixed across datasets from the first batch.
	s, _ = NewSampler(examples, 7)
	first := GroupByDataset(s.Next(32))
	if len(first["nq"]) == 0 || len(first["hotpotqa"]) == 0 {
		t.Errorf("first batch of 32 has %d nq and %d hotpotqa; want both datasets mixed", len(first["nq"]), len(first["hotpotqa"]))
	}

	// Deterministic in the seed.
	a, _ := NewSampler(examples, 7)
	b, _ := NewSampler(examples, 7)
	c, _ := NewSampler(examples, 8)
	batchA, batchB, batchC := ids(a.Next(250)), ids(b.Next(250)), ids(c.Next(250))
	if !reflect.DeepEqual(batchA, batchB) {
		t.Error("two samplers with seed 7 differ; want the same batches")
	}
	if reflect.DeepEqual(batchA, batchC) {
		t.Error("seeds 7 and 8 give the same batches; want the seed to matter")
	}
	// Epochs are shuffled differently.
	if reflect.DeepEqual(batchA[:100], batchA[100:200]) {
		t.Error("epochs 0 and 1 are in the same order; want a fresh shuffle per epoch")
	}
	if s.Next(0) != nil {
		t.Error("Next(0) returned examples, want nil")
	}
}

// TestSamplerResume saves the state mid-epoch through JSON (as a checkpoint
// would) and checks that a new sampler continues exactly like the old one,
// across epoch boundaries.
func TestSamplerResume(t *testing.T) {
	examples := append(synthetic("nq", 40), synthetic("hotpotqa", 13)...)
	for _, drawn := range []int{0, 1, 37, 53, 60, 106, 200} {
		t.Run(fmt.Sprint(drawn), func(t *testing.T) {
			orig, _ := NewSampler(examples, 3)
			orig.Next(drawn)
			saved, err := json.Marshal(orig.State())
			if err != nil {
				t.Fatal(err)
			}
			var st SamplerState
			if err := json.Unmarshal(saved, &st); err != nil {
				t.Fatal(err)
			}
			resumed, _ := NewSampler(examples, 3)
			if err := resumed.Restore(st); err != nil {
				t.Fatalf("Restore(%s): %v", saved, err)
			}
			for i := range 10 {
				want, got := ids(orig.Next(17)), ids(resumed.Next(17))
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("batch %d after resume = %v, want %v", i, got, want)
				}
			}
		})
	}
}

func TestSamplerRestoreMismatch(t *testing.T) {
	examples := synthetic("nq", 20)
	s, _ := NewSampler(examples, 1)
	s.Next(5)
	good := s.State()
	tests := []struct {
		name  string
		state func(SamplerState) SamplerState
		into  []Example
		seed  int64
		is    error
	}{
		{"other seed", func(st SamplerState) SamplerState { return st }, examples, 2, ErrStateMismatch},
		{"other size", func(st SamplerState) SamplerState { return st }, examples[:19], 1, ErrStateMismatch},
		{"other order", func(st SamplerState) SamplerState { return st }, append(slices.Clone(examples[1:]), examples[0]), 1, ErrStateMismatch},
		{"position past the end", func(st SamplerState) SamplerState { st.Pos = 21; return st }, examples, 1, nil},
		{"negative epoch", func(st SamplerState) SamplerState { st.Epoch = -1; return st }, examples, 1, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, _ := NewSampler(tt.into, tt.seed)
			before := r.State()
			err := r.Restore(tt.state(good))
			if err == nil {
				t.Fatal("Restore succeeded; want an error: resuming on other data would silently change training")
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("error %v does not wrap %v", err, tt.is)
			}
			if r.State() != before {
				t.Errorf("failed Restore changed the state to %+v", r.State())
			}
		})
	}
	if _, err := NewSampler(nil, 1); err == nil {
		t.Error("NewSampler(nil) succeeded; want an error")
	}
}

func TestSampleVendoredTest(t *testing.T) {
	// The vendored test files are already the 500-question samples, so
	// sampling 500 keeps every row; 100 keeps a deterministic 100.
	all, err := LoadFile(filepath.Join("qa", "nq", "test.jsonl"), LoadOptions{Dataset: "nq"})
	if err != nil {
		t.Fatal(err)
	}
	if got := SampleTest(all, 500, 0); len(got) != 500 {
		t.Errorf("500 of the 500 vendored nq questions kept %d", len(got))
	}
	a, b := SampleTest(all, 100, 0), SampleTest(all, 100, 0)
	if len(a) != 100 || !reflect.DeepEqual(ids(a), ids(b)) {
		t.Errorf("100 of nq: got %d, reproducible %v; want 100, reproducible", len(a), reflect.DeepEqual(ids(a), ids(b)))
	}
}
