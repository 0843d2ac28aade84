package eval

import (
	"context"
	"errors"
	"fmt"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/procgroup"
	"github.com/recal-project/recal/internal/rollout"
)

// Data-parallel evaluation (Setup.Group): rank 0 alone reads and writes the
// results files and says what is left to answer; every round, each rank
// answers its contiguous share of the next Batch·ranks questions left (its
// own batch of at most Setup.Batch), the answers are gathered in question
// order and rank 0 appends them; rank 0 builds the table. One process is
// the case of one rank, with rounds of Batch questions as before.

// sharedTodo has rank 0 run claim (take the results file, read it, say
// what is left) and tells every rank what it found: the questions left, in
// qs's order, or claim's error, returned on every rank.
func sharedTodo(ctx context.Context, g procgroup.Group, qs []data.Example, claim func() ([]data.Example, error)) ([]data.Example, error) {
	if g.Size() == 1 {
		return claim()
	}
	type found struct {
		Err  string
		Todo []string // question ids
	}
	var f found
	if g.Rank() == 0 {
		todo, err := claim()
		if err != nil {
			f.Err = err.Error()
		}
		for _, q := range todo {
			f.Todo = append(f.Todo, q.ID)
		}
	}
	f, err := procgroup.BroadcastOf(ctx, g, f, 0)
	if err != nil {
		return nil, fmt.Errorf("eval: %w", err)
	}
	if f.Err != "" {
		return nil, errors.New(f.Err)
	}
	byID := make(map[string]data.Example, len(qs))
	for _, q := range qs {
		byID[q.ID] = q
	}
	todo := make([]data.Example, len(f.Todo))
	for i, id := range f.Todo {
		q, ok := byID[id]
		if !ok {
			return nil, fmt.Errorf("eval: rank 0 asks for question %s, which rank %d does not have: every rank must load the same questions", id, g.Rank())
		}
		todo[i] = q
	}
	return todo, nil
}

// answerShared answers todo with r over the ranks of g, round by round, and
// passes each round's answers, in todo's order, to write (on rank 0 only).
// An error on any rank stops every rank.
func answerShared(ctx context.Context, g procgroup.Group, r Router, name string, todo []data.Example, batch int,
	write func([]rollout.QuestionResult) error) error {
	round := batch * g.Size()
	for lo := 0; lo < len(todo); lo += round {
		part := todo[lo:min(lo+round, len(todo))]
		if g.Size() == 1 {
			res, err := r.Answer(ctx, part)
			if err != nil {
				return err
			}
			if err := write(res); err != nil {
				return err
			}
			continue
		}
		type answers struct {
			Err     string
			Results []rollout.QuestionResult
		}
		var mine answers
		if a, b := len(part)*g.Rank()/g.Size(), len(part)*(g.Rank()+1)/g.Size(); a < b {
			res, err := r.Answer(ctx, part[a:b])
			if err != nil {
				mine.Err = err.Error()
			}
			mine.Results = res
		}
		all, err := procgroup.AllGatherOf(context.WithoutCancel(ctx), g, mine)
		if err != nil {
			return fmt.Errorf("eval: router %s: %w", name, err)
		}
		var res []rollout.QuestionResult
		for k, a := range all {
			if a.Err != "" {
				return fmt.Errorf("eval: router %s, rank %d: %s", name, k, a.Err)
			}
			res = append(res, a.Results...)
		}
		if g.Rank() == 0 {
			if err := write(res); err != nil {
				return err
			}
		}
	}
	return nil
}
