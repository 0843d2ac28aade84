package llmpool

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// simQuestion is question i of a synthetic dataset: three content words
// (founded, company<i>, city<i>) and the golden answer Founder<i>.
func simQuestion(dataset string, i int) *Question {
	return &Question{
		ID: fmt.Sprintf("%s-%d", dataset, i), Dataset: dataset,
		Text:   fmt.Sprintf("Who founded company%d in city%d?", i, i),
		Golden: []string{fmt.Sprintf("Founder%d", i), fmt.Sprintf("F%d", i)},
	}
}

// correct reports whether a reply contains a golden answer of q as a word.
func correct(text string, q *Question) bool {
	n := " " + normalizeAnswer(text) + " "
	for _, g := range q.Golden {
		if strings.Contains(n, " "+normalizeAnswer(g)+" ") {
			return true
		}
	}
	return false
}

// accuracyOf asks n questions of dataset with query(i) and returns the
// fraction answered correctly.
func accuracyOf(t *testing.T, p *Pool, model, dataset string, n int, query func(i int) string) float64 {
	t.Helper()
	reqs := make([]Request, n)
	for i := range reqs {
		reqs[i] = Request{Model: model, Query: query(i), Question: simQuestion(dataset, i)}
	}
	right := 0
	for i, r := range p.CallBatch(context.Background(), reqs) {
		if r.Failed {
			t.Fatalf("sim call failed: %v", r.Err)
		}
		if !strings.HasPrefix(r.Text, "[simulated "+model+"] The answer is ") {
			t.Fatalf("sim reply %q, want it to say it is simulated", r.Text)
		}
		if correct(r.Text, reqs[i].Question) {
			right++
		}
	}
	return float64(right) / float64(n)
}

func TestSimAccuracyFollowsConfigAndRelevance(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, testConfig(simModel("sim-a", SimConfig{
		Accuracy:        map[string]float64{"nq": 0.6, "HotpotQA": 0.3, "perfect": 1},
		DefaultAccuracy: 0.1,
		Seed:            7,
	})))
	full := func(i int) string { return fmt.Sprintf("who founded company%d (city%d)", i, i) }
	third := func(i int) string { return fmt.Sprintf("company%d", i) } // 1 of 3 content words
	tests := []struct {
		name    string
		dataset string
		query   func(int) string
		want    float64
	}{
		// 4000 draws: the binomial std is <= 0.008, so +-0.04 is 5 std; the
		// seed is fixed, so the result never changes anyway.
		{name: "nq relevant", dataset: "nq", query: full, want: 0.6},
		{name: "hotpotqa matched without case", dataset: "hotpotqa", query: full, want: 0.3},
		{name: "unlisted dataset uses default", dataset: "triviaqa", query: full, want: 0.1},
		{name: "one third relevant scales accuracy", dataset: "perfect", query: third, want: 1.0 / 3},
		{name: "irrelevant query is always wrong", dataset: "perfect", query: func(int) string { return "weather forecast for tomorrow" }, want: 0},
		{name: "empty query is always wrong", dataset: "perfect", query: func(int) string { return "   " }, want: 0},
		{name: "fully relevant with accuracy 1 is always right", dataset: "perfect", query: full, want: 1},
	}
	ignoring := newTestPool(t, testConfig(simModel("sim-a", SimConfig{
		Accuracy: map[string]float64{"perfect": 1, "nq": 0.6}, Seed: 7, IgnoreQuery: true,
	})))
	irrelevant := func(int) string { return "weather forecast for tomorrow" }
	for _, tc := range []struct {
		name, dataset string
		want          float64
	}{
		{"ignore_query: irrelevant query, accuracy 1", "perfect", 1},
		{"ignore_query: irrelevant query, accuracy 0.6", "nq", 0.6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := accuracyOf(t, ignoring, "sim-a", tc.dataset, 4000, irrelevant); got < tc.want-0.04 || got > tc.want+0.04 {
				t.Errorf("accuracy %.3f, want %.3f +- 0.04 (accuracy[dataset], the query ignored)", got, tc.want)
			}
		})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := accuracyOf(t, p, "sim-a", tc.dataset, 4000, tc.query)
			if got < tc.want-0.04 || got > tc.want+0.04 {
				t.Errorf("accuracy %.3f, want %.3f +- 0.04 (accuracy[dataset] x relevance)", got, tc.want)
			}
		})
	}
}

func TestSimIsDeterministic(t *testing.T) {
	t.Parallel()
	cfg := SimConfig{DefaultAccuracy: 0.5, Seed: 1}
	a := newTestPool(t, testConfig(simModel("s", cfg)))
	b := newTestPool(t, testConfig(simModel("s", cfg)))
	cfg.Seed = 2
	c := newTestPool(t, testConfig(simModel("s", cfg)))
	differ := 0
	for i := range 300 {
		req := Request{Model: "s", Query: fmt.Sprintf("company%d founded city%d", i, i), Question: simQuestion("nq", i)}
		ra, rb, rc := a.Call(context.Background(), req), b.Call(context.Background(), req), c.Call(context.Background(), req)
		if ra.Text != rb.Text || ra.InputTokens != rb.InputTokens || ra.OutputTokens != rb.OutputTokens {
			t.Fatalf("question %d: %q vs %q, want identical replies for the same model, question, query and seed", i, ra.Text, rb.Text)
		}
		if again := a.Call(context.Background(), req); again.Text != ra.Text {
			t.Fatalf("question %d: repeated call %q vs %q, want the same reply", i, again.Text, ra.Text)
		}
		if ra.Text != rc.Text {
			differ++
		}
	}
	if differ < 50 {
		t.Errorf("only %d of 300 replies changed with the seed, want the seed to drive the draws", differ)
	}
}

func TestSimWrongAnswers(t *testing.T) {
	t.Parallel()
	bank := map[string][]string{"NQ": {"Founder1", "Founder2", "Founder3", "Paris"}}
	p := newTestPool(t, testConfig(simModel("s", SimConfig{DefaultAccuracy: 0})), WithAnswerBank(bank))
	fromBank := 0
	for i := range 200 {
		q := simQuestion("nq", i%5)
		r := p.Call(context.Background(), Request{Model: "s", Query: fmt.Sprintf("variant %d", i), Question: q})
		if correct(r.Text, q) {
			t.Fatalf("wrong reply %q contains a golden answer of %v", r.Text, q.Golden)
		}
		for _, a := range bank["NQ"] {
			if strings.HasSuffix(r.Text, " "+a+".") {
				fromBank++
			}
		}
	}
	if fromBank != 200 {
		t.Errorf("%d of 200 wrong replies came from the answer bank, want all (the bank always has a non-golden answer)", fromBank)
	}
	// Without a bank: made-up names, never golden.
	p2 := newTestPool(t, testConfig(simModel("s", SimConfig{})))
	for i := range 200 {
		q := simQuestion("other", i)
		r := p2.Call(context.Background(), Request{Model: "s", Query: "x", Question: q})
		if correct(r.Text, q) || !strings.HasPrefix(r.Text, "[simulated s] The answer is ") {
			t.Fatalf("reply %q, want a made-up wrong answer in the simulator's sentence", r.Text)
		}
	}
	if r := p2.Call(context.Background(), Request{Model: "s", Query: "who?"}); r.Failed || !strings.HasPrefix(r.Text, "[simulated s]") {
		t.Errorf("call without a question = %+v, want a wrong reply, not a failure", r)
	}
}

func TestSimLatencyTokensAndFailures(t *testing.T) {
	t.Parallel()
	slow := simModel("slow", SimConfig{Latency: 10 * time.Second})
	timed := simModel("timed", SimConfig{Latency: 30 * time.Millisecond, TokensIn: 100, TokensOut: 20})
	timed.PriceIn, timed.PriceOut = 0.5, 1.5
	flaky := simModel("flaky", SimConfig{FailureRate: 0.5})
	p := newTestPool(t, testConfig(slow, timed, flaky))

	start := time.Now()
	r := p.Call(ctxTimeout(t, 50*time.Millisecond), Request{Model: "slow", Query: "q"})
	if !r.Failed || !errors.Is(r.Err, context.DeadlineExceeded) || time.Since(start) > time.Second {
		t.Errorf("10s simulated latency under a 50ms deadline: %+v after %v, want a prompt failure", r, time.Since(start))
	}
	r = p.Call(context.Background(), Request{Model: "timed", Query: "q"})
	if r.Latency < 30*time.Millisecond || r.InputTokens != 100 || r.OutputTokens != 20 || !approx(r.Cost, (100*0.5+20*1.5)/1e6) {
		t.Errorf("got %+v, want >= 30ms latency, 100/20 tokens and cost 8e-05 USD", r)
	}
	fails := 0
	for i := range 400 {
		if r := p.Call(context.Background(), Request{Model: "flaky", Query: fmt.Sprint("q", i)}); r.Failed {
			fails++
			if r.Text != "[pool error: model flaky unavailable]" {
				t.Fatalf("simulated failure text %q, want the failure text", r.Text)
			}
		}
	}
	if fails < 140 || fails > 260 {
		t.Errorf("%d of 400 calls failed with failure_rate 0.5, want about 200", fails)
	}
}

func TestRelevance(t *testing.T) {
	t.Parallel()
	tests := []struct {
		question, query string
		want            float64
	}{
		{"Who is the author of Hamlet?", "Hamlet author", 1},
		{"Who wrote Hamlet?", "Hamlet author", 0.5},
		{"Who founded company7 in city7?", "company7", 1.0 / 3},
		{"Who founded company7 in city7?", "", 0},
		{"Who is it?", "anything", 1}, // no content words
		{"When did the Berlin Wall fall?", "berlin wall FALL", 1},
		{"When did the Berlin Wall fall?", "weather", 0},
	}
	for _, tc := range tests {
		if got := relevance(tc.question, tc.query); !approx(got, tc.want) {
			t.Errorf("relevance(%q, %q) = %v, want %v", tc.question, tc.query, got, tc.want)
		}
	}
}
