package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/generate"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/internal/tokenizer"
	"github.com/recal-project/recal/router"
	"github.com/recal-project/recal/torchbridge"
)

// forced runs the real policy's forward pass for every token, then replaces
// the sampled token with the next one of a scripted routing trajectory, so
// that every response makes exactly maxTurns pool calls whatever the
// (untrained) weights would have sampled. The compute per step is the same
// as in a real rollout.
type forced struct {
	inner generate.Decoder
	turns [][]int32 // the script's turns, in tokens
	state map[int]*struct{ turn, pos int }
}

func (f *forced) Extend(ctx context.Context, rows []int, toks [][]int32, s generate.Sampling, seed uint64) ([]int32, []float32, error) {
	_, logp, err := f.inner.Extend(ctx, rows, toks, s, seed)
	if err != nil {
		return nil, nil, err
	}
	next := make([]int32, len(rows))
	for k, r := range rows {
		st := f.state[r]
		if st == nil {
			st = &struct{ turn, pos int }{}
			f.state[r] = st
		}
		if len(toks[k]) > 1 && st.pos > 0 { // an <information> block: the next turn starts
			st.turn, st.pos = st.turn+1, 0
		}
		turn := f.turns[min(st.turn, len(f.turns)-1)]
		next[k] = turn[min(st.pos, len(turn)-1)]
		st.pos++
	}
	return next, logp, nil
}

// scriptedRollout rolls out 64 questions × 4 samples of the tiny policy
// with up to 3 calls each (the forced script) to simulated models answering
// in latency, its decode calls split among workers threads
// (policy.rollout_workers) while libtorch runs decodeThreads.
func scriptedRollout(latency time.Duration, decodeThreads, workers int) ([]router.Sample, router.Stats, int, error) {
	ctx := context.Background()
	cfg, err := config.Load("recal.toml", []string{"policy.checkpoint=runs/init/tiny", "router.max_turns=3"})
	if err != nil {
		return nil, router.Stats{}, 0, err
	}
	for i := range cfg.Pool.Models {
		cfg.Pool.Models[i].Sim.Latency = latency
	}
	eng, err := rollout.OpenEngine(cfg.Policy.Checkpoint, trainerOptions(cfg))
	if err != nil {
		return nil, router.Stats{}, 0, fmt.Errorf("rollout bench needs the tiny checkpoint (make train creates it, or recal policy init --preset tiny --out runs/init/tiny): %w", err)
	}
	defer eng.Close()
	train, _, err := cfg.Data.LoadTrain()
	if err != nil {
		return nil, router.Stats{}, 0, err
	}
	env, err := rollout.NewEnv(cfg.Rollout(), eng, rollout.AnswerBank(train), nil)
	if err != nil {
		return nil, router.Stats{}, 0, err
	}
	defer env.Close()
	sampler, err := data.NewSampler(train, 1)
	if err != nil {
		return nil, router.Stats{}, 0, err
	}
	qs := sampler.Next(64)
	const g = 4
	var jobs []router.Job
	longest := 0
	for _, q := range qs {
		p, err := env.PromptTokens(q)
		if err != nil {
			return nil, router.Stats{}, 0, err
		}
		longest = max(longest, len(p))
		for range g {
			jobs = append(jobs, router.Job{Question: rollout.Question(q), Prompt: p})
		}
	}
	script := scriptTurns(eng.Tok, env.Pool.Models()[0].Name)
	cache, err := eng.Policy.NewCache(len(jobs), longest+cfg.Router.Capacity())
	if err != nil {
		return nil, router.Stats{}, 0, err
	}
	defer cache.Close()
	restore, err := rollout.DecodeThreads(decodeThreads)
	if err != nil {
		return nil, router.Stats{}, 0, err
	}
	defer restore()
	dec := &forced{inner: rollout.Decoder{C: cache, Logp: true, Workers: workers}, turns: script, state: map[int]*struct{ turn, pos int }{}}
	samples, st, err := router.Rollout(ctx, dec, eng.Tok, env.Pool, cfg.Router, jobs, generate.Sampling{Temperature: 1, TopP: 1}, eng.EOS, 1)
	return samples, st, len(qs), err
}

// rolloutBench compares the wall time of a rollout with its critical path
// (decode time + the slowest call of each turn), with calls of 300 ms.
func rolloutBench() error {
	samples, st, nq, err := scriptedRollout(300*time.Millisecond, 0, 1)
	if err != nil {
		return err
	}
	calls := 0
	for _, s := range samples {
		calls += len(s.CalledModels())
	}
	fmt.Printf("\nrollout: %d questions x G=4, tiny policy, sim pool at 300 ms per call, up to 3 turns (%d calls)\n", nq, calls)
	fmt.Printf("  wall time        %8.2f s\n", st.Wall.Seconds())
	fmt.Printf("  decode time      %8.2f s\n", st.Decode.Seconds())
	fmt.Printf("  slowest calls    %8.2f s (sum over turns)\n", st.SlowestSum.Seconds())
	fmt.Printf("  critical path    %8.2f s\n", st.CriticalPath().Seconds())
	fmt.Printf("  wall / critical  %8.2fx  (target <= 1.2x)\n", st.Wall.Seconds()/st.CriticalPath().Seconds())
	return nil
}

// workersBench decodes the same rollout (the offline default's 5 ms sim
// calls, one libtorch thread as policy.decode_threads = 1) with one worker
// and with workers, alternately, twice each, and checks that the split
// happened and gave the same log-probs, bit for bit.
func workersBench(workers int) error {
	var ref []router.Sample
	walls := map[int][]float64{}
	same := true
	for round := 0; round < 4; round++ {
		w := []int{1, workers}[round%2]
		before := torchbridge.ParallelCalls()
		samples, st, _, err := scriptedRollout(5*time.Millisecond, 1, w)
		if err != nil {
			return err
		}
		if split := torchbridge.ParallelCalls() - before; (split > 0) != (w > 1) {
			return fmt.Errorf("rollout workers: %d workers split %d decode calls among threads", w, split)
		}
		walls[w] = append(walls[w], st.Wall.Seconds())
		// The script fixes the tokens; the log-probs are the policy's own.
		if ref == nil {
			ref = samples
		}
		same = same && len(samples) == len(ref)
		for i := 0; same && i < len(ref); i++ {
			same = slices.Equal(ref[i].Logp, samples[i].Logp)
		}
	}
	fmt.Printf("\nrollout workers: the same rollout, sim pool at 5 ms per call, decode_threads = 1, alternately\n")
	fmt.Printf("  1 worker         %8.2f s wall (runs: %.2f, %.2f)\n", mean(walls[1]), walls[1][0], walls[1][1])
	fmt.Printf("  %d workers        %8.2f s wall (runs: %.2f, %.2f)\n", workers, mean(walls[workers]), walls[workers][0], walls[workers][1])
	fmt.Printf("  speed-up         %8.2fx  (log-probs bit-identical: %v)\n", mean(walls[1])/mean(walls[workers]), same)
	if !same {
		return fmt.Errorf("rollout workers: %d workers gave other log-probs than one", workers)
	}
	return nil
}

func mean(v []float64) float64 {
	t := 0.0
	for _, x := range v {
		t += x
	}
	return t / float64(len(v))
}

// scriptTurns is a routing trajectory: three searches, then an answer.
func scriptTurns(tok *tokenizer.Tokenizer, model string) [][]int32 {
	enc := func(s string) []int32 { return rollout.ToInt32(tok.Encode(s)) }
	search := enc("<think>I will ask a model.</think>\n<search>" + model + ": who is the author of this book and when</search>")
	return [][]int32{search, search, search, enc("<think>Found it.</think>\n<answer>William Shakespeare</answer>")}
}
