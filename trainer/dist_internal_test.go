package trainer

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/recal-project/recal/internal/procgroup"
)

// The mini-batches of a step: response-major cuts, each in global row
// order, covering every row once; with k dividing the group size every
// rank (a contiguous run of whole groups) holds the same share of each,
// whatever the number of ranks.
func TestMiniBatches(t *testing.T) {
	cases := []struct {
		name         string
		questions, g int
		k            int
		want         [][]int
	}{
		{"one mini-batch is every row in order", 3, 2, 1, [][]int{{0, 1, 2, 3, 4, 5}}},
		{"two of G=2: response 0 of each group, then response 1", 2, 2, 2, [][]int{{0, 2}, {1, 3}}},
		{"two of G=4: responses 0-1, then 2-3", 2, 4, 2, [][]int{{0, 1, 4, 5}, {2, 3, 6, 7}}},
		{"k = G: one response of each group per mini-batch", 2, 3, 3, [][]int{{0, 3}, {1, 4}, {2, 5}}},
		{"k above G cuts a response's rows", 2, 2, 4, [][]int{{0}, {2}, {1}, {3}}},
		{"k not dividing G", 2, 3, 2, [][]int{{0, 1, 3}, {2, 4, 5}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := miniBatches(c.questions, c.g, c.k); !reflect.DeepEqual(got, c.want) {
				t.Errorf("miniBatches(%d questions, G=%d, k=%d) = %v, want %v", c.questions, c.g, c.k, got, c.want)
			}
		})
	}

	t.Run("every rank has its share of every mini-batch", func(t *testing.T) {
		for _, questions := range []int{4, 8, 12} {
			for _, g := range []int{2, 4, 8} {
				for _, k := range []int{1, 2, g} {
					mbs := miniBatches(questions, g, k)
					seen := map[int]int{}
					for _, mb := range mbs {
						for _, i := range mb {
							seen[i]++
						}
					}
					if len(mbs) != k || len(seen) != questions*g {
						t.Fatalf("miniBatches(%d, %d, %d): %d mini-batches over %d distinct rows, want %d over all %d", questions, g, k, len(mbs), len(seen), k, questions*g)
					}
					for size := 1; size <= questions; size++ {
						if questions%size != 0 {
							continue
						}
						for m, mb := range mbs {
							for rank := 0; rank < size; rank++ {
								qlo, qhi := shareOf(questions, rank, size)
								n := 0
								for _, i := range mb {
									if i >= qlo*g && i < qhi*g {
										n++
									}
								}
								if want := len(mb) / size; n != want {
									t.Errorf("%d questions, G=%d, %d mini-batches, %d ranks: rank %d holds %d rows of mini-batch %d, want %d (an equal share, so no rank idles at the all-reduce)",
										questions, g, k, size, rank, n, m, want)
								}
							}
						}
					}
				}
			}
		}
	})
}

// policy.device with several ranks: "cuda" gives each local rank its own
// GPU; an explicit "cuda:N" would put every rank of a node on GPU N and is
// refused, naming the key and the fix; one process keeps any setting.
func TestRankDevice(t *testing.T) {
	two := func(rank, local int) procgroup.Launch {
		return procgroup.Launch{Launcher: "torchrun", Rank: rank, WorldSize: 2, LocalRank: local, MasterAddr: "127.0.0.1", MasterPort: 29500}
	}
	cases := []struct {
		name    string
		device  string
		launch  procgroup.Launch
		want    string
		wantErr string
	}{
		{"one process keeps cuda:1", "cuda:1", procgroup.Launch{WorldSize: 1}, "cuda:1", ""},
		{"one process keeps cuda", "cuda", procgroup.Launch{WorldSize: 1}, "cuda", ""},
		{"cpu stays cpu", "cpu", two(1, 1), "cpu", ""},
		{"cuda becomes cuda:LOCAL_RANK", "cuda", two(1, 1), "cuda:1", ""},
		{"cuda on rank 0", "cuda", two(0, 0), "cuda:0", ""},
		{"cuda:0 refused on rank 0", "cuda:0", two(0, 0), "", `policy.device = "cuda:0" names one GPU, but this process is rank 0 of 2`},
		{"cuda:0 refused on rank 1", "cuda:0", two(1, 1), "", `use policy.device = "cuda", which gives each rank cuda:LOCAL_RANK (here cuda:1)`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := RankDevice(c.device, c.launch)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("RankDevice(%q) = %q, %v; want an error saying %q: several ranks must not share one GPU unknowingly", c.device, got, err, c.wantErr)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("RankDevice(%q) = %q, %v; want %q", c.device, got, err, c.want)
			}
		})
	}
}

// dist.backend "auto" carries the gradient all-reduce on NCCL for CUDA
// devices only: NCCL cannot reduce tensors on any other device.
func TestGroupBackend(t *testing.T) {
	cases := []struct{ backend, device, want string }{
		{"auto", "cpu", "gloo"},
		{"auto", "cuda", "nccl"},
		{"auto", "cuda:3", "nccl"},
		{"auto", "mps", "gloo"},
		{"auto", "xpu:0", "gloo"},
		{"", "", "gloo"},
		{"", "cuda:0", "nccl"},
		{"gloo", "cuda:0", "gloo"},
		{"nccl", "cuda", "nccl"},
	}
	for _, c := range cases {
		if got := groupBackend(c.backend, c.device); got != c.want {
			t.Errorf("groupBackend(%q, %q) = %q, want %q", c.backend, c.device, got, c.want)
		}
	}
}

// memGroup is a dist.Group of n ranks in one process (goroutines), for the
// collectives of the trainer's records: all-gathers and barriers.
type memGroup struct {
	h    *memHub
	rank int
	seq  int
}

type memHub struct {
	mu     sync.Mutex
	cond   *sync.Cond
	n      int
	rounds map[int][][]byte
}

func newMemGroup(n int) []*memGroup {
	h := &memHub{n: n, rounds: map[int][][]byte{}}
	h.cond = sync.NewCond(&h.mu)
	gs := make([]*memGroup, n)
	for r := range gs {
		gs[r] = &memGroup{h: h, rank: r}
	}
	return gs
}

func (g *memGroup) Rank() int { return g.rank }
func (g *memGroup) Size() int { return g.h.n }
func (g *memGroup) AllGather(_ context.Context, data []byte) ([][]byte, error) {
	h := g.h
	h.mu.Lock()
	defer h.mu.Unlock()
	round := g.seq
	g.seq++
	if h.rounds[round] == nil {
		h.rounds[round] = make([][]byte, h.n)
	}
	h.rounds[round][g.rank] = append([]byte{}, data...)
	h.cond.Broadcast()
	for slices.ContainsFunc(h.rounds[round], func(b []byte) bool { return b == nil }) {
		h.cond.Wait()
	}
	return slices.Clone(h.rounds[round]), nil
}
func (g *memGroup) Broadcast(ctx context.Context, data []byte, root int) ([]byte, error) {
	parts, err := g.AllGather(ctx, data)
	if err != nil {
		return nil, err
	}
	return parts[root], nil
}
func (g *memGroup) Barrier(ctx context.Context) error {
	_, err := g.AllGather(ctx, []byte{1})
	return err
}
func (g *memGroup) Close() error { return nil }

// The rollouts' wall time of a step (rollout_time_s) is the slowest rank's
// on every rank, interrupted or not: the step waits for it at the gather,
// and rank 0's own time would hide a slow rank. The rows come in rank
// (global row) order.
func TestGatherRollouts(t *testing.T) {
	cases := []struct {
		name        string
		walls       []time.Duration
		interrupted []bool
	}{
		{"rank 1 slowest", []time.Duration{time.Second, 3 * time.Second}, []bool{false, false}},
		{"rank 0 slowest", []time.Duration{5 * time.Second, 2 * time.Second}, []bool{false, false}},
		{"rank 1 interrupted", []time.Duration{time.Second, 4 * time.Second}, []bool{false, true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			gs := newMemGroup(len(c.walls))
			got := make([]stepRollouts, len(gs))
			errs := make([]error, len(gs))
			var wg sync.WaitGroup
			for r := range gs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					mine := rankRollout{Interrupted: c.interrupted[r], Wall: c.walls[r]}
					if !mine.Interrupted {
						mine.Rows = []rowRecord{{Tokens: float64(10 * r)}, {Tokens: float64(10*r + 1)}}
					}
					got[r], errs[r] = ranks{Group: gs[r], grads: procgroup.Single()}.gatherRollouts(context.Background(), mine)
				}()
			}
			wg.Wait()
			want := slices.Max(c.walls)
			anyInterrupted := slices.Contains(c.interrupted, true)
			for r, b := range got {
				if errs[r] != nil {
					t.Fatalf("rank %d: %v", r, errs[r])
				}
				if b.wall != want {
					t.Errorf("rank %d: rollout wall %v, want %v (the slowest rank's: every rank waits for it)", r, b.wall, want)
				}
				if b.interrupted != anyInterrupted {
					t.Errorf("rank %d: interrupted %v, want %v (any rank's interruption drops the step on all)", r, b.interrupted, anyInterrupted)
				}
				if !anyInterrupted && !reflect.DeepEqual(b.tokens, []float64{0, 1, 10, 11}) {
					t.Errorf("rank %d: tokens %v, want [0 1 10 11]: every rank's rows in global row order", r, b.tokens)
				}
			}
		})
	}
}
