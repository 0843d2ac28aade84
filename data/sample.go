package data

import (
	"hash/fnv"
	"math/bits"
	"slices"
)

// rng is a SplitMix64 generator (Steele, Lea and Flood 2014). It is written
// out here, rather than taken from math/rand, so that samples and shuffles
// stay the same across Go releases: a run resumed or re-evaluated with a new
// toolchain must see the same questions.
type rng struct{ state uint64 }

// newRNG seeds a generator from the user's seed and a label naming the
// stream ("test/nq", "epoch/3"), so that streams are independent: adding a
// dataset does not change another dataset's sample.
func newRNG(seed int64, label string) *rng {
	h := fnv.New64a()
	h.Write([]byte(label))
	r := &rng{state: uint64(seed) ^ h.Sum64()}
	r.next() // decorrelate nearby seeds
	return r
}

func (r *rng) next() uint64 {
	r.state += 0x9e3779b97f4a7c15
	z := r.state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// intn returns a uniform int in [0, n) by Lemire's multiply-and-reject
// method (no modulo bias). n must be positive.
func (r *rng) intn(n int) int {
	bound := uint64(n)
	hi, lo := bits.Mul64(r.next(), bound)
	if lo < bound {
		threshold := -bound % bound
		for lo < threshold {
			hi, lo = bits.Mul64(r.next(), bound)
		}
	}
	return int(hi)
}

// perm returns a Fisher–Yates shuffle of 0..n-1.
func (r *rng) perm(n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	for i := n - 1; i > 0; i-- {
		j := r.intn(i + 1)
		p[i], p[j] = p[j], p[i]
	}
	return p
}

// sampleIndexes picks k of 0..n-1 uniformly without replacement and returns
// them sorted, so that a sample keeps file order. k ≥ n picks all.
func sampleIndexes(n, k int, r *rng) []int {
	if k >= n {
		k = n
	}
	// Partial Fisher–Yates: the first k slots end up a uniform sample.
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	for i := 0; i < k; i++ {
		j := i + r.intn(n-i)
		p[i], p[j] = p[j], p[i]
	}
	out := p[:k:k]
	slices.Sort(out)
	return out
}

// Sample returns up to k examples drawn uniformly without replacement, in
// their original order. The draw depends only on seed, label and len(examples);
// label names the stream (Config uses "test/<dataset>" and "val/<dataset>").
// k ≤ 0 or k ≥ len(examples) returns all of them. The result is a new slice.
func Sample(examples []Example, k int, seed int64, label string) []Example {
	if k <= 0 || k >= len(examples) {
		return slices.Clone(examples)
	}
	idx := sampleIndexes(len(examples), k, newRNG(seed, label))
	out := make([]Example, len(idx))
	for i, j := range idx {
		out[i] = examples[j]
	}
	return out
}

// SampleTest keeps up to perDataset examples of each dataset, drawn with
// Sample under the label "test/<dataset>", in their original order. This is
// the evaluation protocol of docs/method.md: 500 questions per dataset with a
// fixed seed, all 125 of Bamboogle. perDataset ≤ 0 keeps all.
func SampleTest(examples []Example, perDataset int, seed int64) []Example {
	byDataset := make(map[string][]int)
	for i, ex := range examples {
		byDataset[ex.Dataset] = append(byDataset[ex.Dataset], i)
	}
	keep := make([]bool, len(examples))
	for ds, idx := range byDataset {
		k := perDataset
		if k <= 0 {
			k = len(idx)
		}
		// The same draw as Sample(group, perDataset, seed, "test/"+ds).
		for _, j := range sampleIndexes(len(idx), k, newRNG(seed, "test/"+ds)) {
			keep[idx[j]] = true
		}
	}
	var out []Example
	for i, ex := range examples {
		if keep[i] {
			out = append(out, ex)
		}
	}
	return out
}
