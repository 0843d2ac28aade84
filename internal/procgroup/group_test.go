package procgroup_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/recal-project/recal/internal/procgroup"
)

func ExampleSingle() {
	ctx := context.Background()
	g := procgroup.Single()
	defer g.Close()
	parts, _ := g.AllGather(ctx, []byte("rewards of rank 0"))
	b, _ := g.Broadcast(ctx, []byte("step 7"), 0)
	fmt.Println(g.Rank(), g.Size(), len(parts), string(parts[0]), string(b))
	fmt.Println(g.Barrier(ctx), g.AllReduceGrads(ctx))
	// Output:
	// 0 1 1 rewards of rank 0 step 7
	// <nil> <nil>
}

func TestSingle(t *testing.T) {
	ctx := context.Background()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	g := procgroup.Single()
	in := []byte{1, 2, 3}
	parts, err := g.AllGather(ctx, in)
	if err != nil || len(parts) != 1 || string(parts[0]) != string(in) {
		t.Fatalf("AllGather = %v, %v; want [[1 2 3]]", parts, err)
	}
	parts[0][0] = 9
	if in[0] != 1 {
		t.Errorf("AllGather returned the caller's buffer, not a copy: a change to the result changed the input")
	}
	tests := []struct {
		name string
		run  func(context.Context) error
		want error // nil: no error; otherwise errors.Is target, or errAny
	}{
		{"broadcast from 0", func(ctx context.Context) error { _, err := g.Broadcast(ctx, in, 0); return err }, nil},
		{"broadcast from 1", func(ctx context.Context) error { _, err := g.Broadcast(ctx, in, 1); return err }, errAny},
		{"barrier", g.Barrier, nil},
		{"all-reduce", g.AllReduceGrads, nil},
		{"barrier, cancelled", func(context.Context) error { return g.Barrier(cancelled) }, context.Canceled},
		{"all-gather, cancelled", func(context.Context) error { _, err := g.AllGather(cancelled, in); return err }, context.Canceled},
		{"all-reduce, cancelled", func(context.Context) error { return g.AllReduceGrads(cancelled) }, context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.run(ctx)
			switch {
			case tt.want == nil && err != nil:
				t.Fatalf("got %v, want no error", err)
			case tt.want == errAny && err == nil:
				t.Fatalf("got no error, want one: a group of one has no rank 1")
			case tt.want != nil && tt.want != errAny && !errors.Is(err, tt.want):
				t.Fatalf("got %v, want %v: a cancelled ctx must stop a collective before it starts", err, tt.want)
			}
		})
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if err := g.Close(); err != nil {
		t.Fatalf("second Close: %v, want nil", err)
	}
}

var errAny = errors.New("any error")

func TestGradReducerFunc(t *testing.T) {
	calls := 0
	var r procgroup.GradReducer = procgroup.GradReducerFunc(func(context.Context) error { calls++; return nil })
	if err := r.AllReduceGrads(context.Background()); err != nil || calls != 1 {
		t.Fatalf("AllReduceGrads: err %v, %d calls; want nil and 1", err, calls)
	}
}
