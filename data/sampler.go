package data

import (
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
)

// Sampler draws training batches from a mixed training set: each epoch is a
// fresh shuffle of all examples (datasets mixed in proportion to their size),
// drawn from the seed and the epoch number alone, so that a run resumed from
// a saved SamplerState sees exactly the batches it would have seen.
//
// A Sampler is not safe for concurrent use.
type Sampler struct {
	examples    []Example
	seed        int64
	epoch       int
	pos         int
	perm        []int // shuffle of the current epoch
	fingerprint string
}

// SamplerState is the part of a Sampler saved in checkpoints.
type SamplerState struct {
	Seed        int64  `json:"seed"`        // seed of the shuffles
	Epoch       int    `json:"epoch"`       // completed passes over the training set
	Pos         int    `json:"pos"`         // examples already drawn in the current epoch
	Size        int    `json:"size"`        // number of training examples
	Fingerprint string `json:"fingerprint"` // hash of the training ids in order, to catch a changed training set on resume
}

// NewSampler returns a sampler over examples at epoch 0, position 0. The
// examples are copied; their order matters (it is part of the
// fingerprint), so build them the same way on resume.
func NewSampler(examples []Example, seed int64) (*Sampler, error) {
	if len(examples) == 0 {
		return nil, errors.New("data: sampler needs at least one example")
	}
	h := fnv.New64a()
	for _, ex := range examples {
		h.Write([]byte(ex.ID))
		h.Write([]byte{0})
	}
	s := &Sampler{
		examples:    slices.Clone(examples),
		seed:        seed,
		fingerprint: strconv.FormatUint(h.Sum64(), 16),
	}
	s.shuffle()
	return s, nil
}

func (s *Sampler) shuffle() {
	s.perm = newRNG(s.seed, "epoch/"+strconv.Itoa(s.epoch)).perm(len(s.examples))
}

// Len returns the number of training examples.
func (s *Sampler) Len() int { return len(s.examples) }

// Next returns the next n examples, moving into the next epoch (and its new
// shuffle) when the current one runs out, so a batch may straddle two
// epochs. Within an epoch no example repeats. n ≤ 0 returns nil. The
// examples share their Golden slices with the sampler: treat them as
// read-only.
func (s *Sampler) Next(n int) []Example {
	if n <= 0 {
		return nil
	}
	out := make([]Example, 0, n)
	for len(out) < n {
		if s.pos == len(s.perm) {
			s.epoch++
			s.pos = 0
			s.shuffle()
		}
		out = append(out, s.examples[s.perm[s.pos]])
		s.pos++
	}
	return out
}

// State returns the position to save in a checkpoint.
func (s *Sampler) State() SamplerState {
	return SamplerState{Seed: s.seed, Epoch: s.epoch, Pos: s.pos, Size: len(s.examples), Fingerprint: s.fingerprint}
}

// Restore moves the sampler to a saved position. The state must come from a
// sampler with the same seed and the same training examples in the same
// order; otherwise it returns an error wrapping ErrStateMismatch and leaves
// the sampler unchanged.
func (s *Sampler) Restore(st SamplerState) error {
	switch {
	case st.Seed != s.seed:
		return fmt.Errorf("data: %w: seed %d, sampler has %d", ErrStateMismatch, st.Seed, s.seed)
	case st.Size != len(s.examples):
		return fmt.Errorf("data: %w: %d training examples, sampler has %d", ErrStateMismatch, st.Size, len(s.examples))
	case st.Fingerprint != s.fingerprint:
		return fmt.Errorf("data: %w: training set fingerprint %s, sampler has %s", ErrStateMismatch, st.Fingerprint, s.fingerprint)
	case st.Epoch < 0 || st.Pos < 0 || st.Pos > st.Size:
		return fmt.Errorf("data: bad sampler state: epoch %d, position %d of %d", st.Epoch, st.Pos, st.Size)
	}
	s.epoch, s.pos = st.Epoch, st.Pos
	s.shuffle()
	return nil
}
