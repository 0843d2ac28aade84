package trainer

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/recal-project/recal/torchbridge"
)

// reference is the KL reference policy: resident for the run, or
// (policy.reload_reference) loaded from its checkpoint folder for each
// step's scoring and freed after, so that no copy of it is in memory during
// the rollout and the update. Both give the same log-probs.
type reference struct {
	dir      string
	opt      torchbridge.Options
	resident *torchbridge.Policy // nil when reloaded
	files    string              // the folder's files' names, sizes and times at start (reloaded)
}

// folderState lists dir's files with their sizes and modification times:
// what a reloaded reference checks before each load, so that a checkpoint
// changed during the run fails the step instead of scoring against
// other weights.
func folderState(dir string) (string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("KL reference: %w", err)
	}
	var b strings.Builder
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			return "", fmt.Errorf("KL reference: %w", err)
		}
		if fi.Mode().IsRegular() {
			fmt.Fprintf(&b, "%s %d %d\n", e.Name(), fi.Size(), fi.ModTime().UnixNano())
		}
	}
	return b.String(), nil
}

// openReference loads the reference in dir once, which checks it at start;
// it stays loaded unless reload.
func openReference(dir string, opt torchbridge.Options, reload bool) (*reference, error) {
	p, err := loadReference(dir, opt)
	if err != nil {
		return nil, err
	}
	// The reloads read a folder this first load checked and folderState
	// then finds unchanged: its checksums are not hashed again each step.
	reopt := opt
	reopt.Unchecked = true
	r := &reference{dir: dir, opt: reopt, resident: p}
	if reload {
		r.resident = nil
		if err := p.Close(); err != nil {
			return nil, err
		}
		if r.files, err = folderState(dir); err != nil {
			return nil, err
		}
	}
	return r, nil
}

func loadReference(dir string, opt torchbridge.Options) (*torchbridge.Policy, error) {
	p, err := torchbridge.LoadPolicy(dir, opt)
	if err != nil {
		return nil, fmt.Errorf("KL reference: %w", err)
	}
	if err := p.SetTrainable(false); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// score fills each sequence's RefLogp (see refLogp), loading the reference
// first when it is not resident.
func (r *reference) score(ctx context.Context, seqs []torchbridge.Sequence, micro int) error {
	if r.resident != nil {
		return refLogp(ctx, r.resident, seqs, micro)
	}
	// What the last update's activations left free in the heap goes back
	// first, or the reference would be loaded beside it (Close releases
	// what the reference leaves).
	if err := torchbridge.ReleaseMemory(); err != nil {
		return err
	}
	if now, err := folderState(r.dir); err != nil {
		return err
	} else if now != r.files {
		return fmt.Errorf("KL reference: %s changed since the run started (policy.reload_reference reads it each step)", r.dir)
	}
	p, err := loadReference(r.dir, r.opt)
	if err != nil {
		return err
	}
	if err := refLogp(ctx, p, seqs, micro); err != nil {
		p.Close()
		return err
	}
	return p.Close()
}

// Close frees a resident reference.
func (r *reference) Close() error {
	if r.resident == nil {
		return nil
	}
	err := r.resident.Close()
	r.resident = nil
	return err
}

// refLogp fills RefLogp with the reference policy's log-probs of the policy tokens.
func refLogp(ctx context.Context, ref *torchbridge.Policy, seqs []torchbridge.Sequence, micro int) error {
	return perMicroBatch(seqs, micro, func(toks [][]int32, masks [][]float32) ([][]float32, error) {
		lp, _, err := ref.ScoreMasked(ctx, toks, masks)
		return lp, err
	}, func(s *torchbridge.Sequence, row []float32) { s.RefLogp = row })
}

// perMicroBatch runs score over seqs' tokens and masks, micro sequences at
// a time in order, and hands each sequence its row of the result.
func perMicroBatch(seqs []torchbridge.Sequence, micro int, score func(toks [][]int32, masks [][]float32) ([][]float32, error),
	set func(s *torchbridge.Sequence, row []float32)) error {
	for lo := 0; lo < len(seqs); lo += micro {
		part := seqs[lo:min(lo+micro, len(seqs))]
		toks := make([][]int32, len(part))
		masks := make([][]float32, len(part))
		for k := range part {
			toks[k], masks[k] = part[k].Tokens, part[k].Mask
		}
		rows, err := score(toks, masks)
		if err != nil {
			return err
		}
		for k := range part {
			set(&part[k], rows[k])
		}
	}
	return nil
}
