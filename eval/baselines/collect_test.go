package baselines

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/llmpool"
)

// simPool is two simulated models: "always" answers every question right,
// "never" none.
func simPool(t *testing.T, cfgEdit func(*llmpool.Config)) (*llmpool.Pool, PoolInfo) {
	t.Helper()
	cfg := llmpool.Defaults()
	cfg.Cache = llmpool.CacheOff
	cfg.Models = []llmpool.ModelConfig{
		{Name: "always", Description: "right", Provider: "sim", PriceIn: 1, PriceOut: 1, Sim: &llmpool.SimConfig{DefaultAccuracy: 1, IgnoreQuery: true}},
		{Name: "never", Description: "wrong", Provider: "sim", PriceIn: 2, PriceOut: 2, Sim: &llmpool.SimConfig{DefaultAccuracy: 0, IgnoreQuery: true}},
	}
	if cfgEdit != nil {
		cfgEdit(&cfg)
	}
	bank := map[string][]string{"nq": {"Paris", "Berlin", "Rome"}}
	pool, err := llmpool.New(cfg, llmpool.WithAnswerBank(bank))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	info, err := PoolIdentity(cfg, bank)
	if err != nil {
		t.Fatal(err)
	}
	return pool, info
}

func questions(n int) []data.Example {
	out := make([]data.Example, n)
	for i := range out {
		out[i] = data.Example{ID: fmt.Sprintf("nq/%d", i), Dataset: "nq", Question: fmt.Sprintf("question number %d?", i),
			Golden: []string{fmt.Sprintf("answer %d", i)}}
	}
	return out
}

// extract mimics eval.ExtractAnswer on simulated replies.
func extract(reply string) string {
	if k := strings.LastIndex(reply, "answer is"); k >= 0 {
		reply = reply[k+len("answer is"):]
	}
	return strings.TrimSuffix(strings.TrimSpace(reply), ".")
}

// Collect asks every model every question, scores the replies, resumes
// without asking again, skips a torn line, and refuses another pool's
// folder.
func TestCollect(t *testing.T) {
	dir := t.TempDir()
	pool, info := simPool(t, nil)
	qs := questions(10)
	ctx := context.Background()
	st, err := Collect(ctx, dir, CollectOptions{Pool: pool, Info: info, Questions: qs[:6], Extract: extract, Chunk: 4})
	if err != nil {
		t.Fatal(err)
	}
	if st.Pairs != 12 || st.Asked != 12 || st.Skipped != 0 {
		t.Fatalf("stats %+v, want 12 pairs asked", st)
	}
	// A torn last line (a kill mid-write) is skipped and does not glue onto
	// the next run's first line.
	f, _ := os.OpenFile(filepath.Join(dir, OutcomesFile), os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"question_id":"nq/9","model":"alw`)
	f.Close()
	st, err = Collect(ctx, dir, CollectOptions{Pool: pool, Info: info, Questions: qs, Extract: extract})
	if err != nil {
		t.Fatal(err)
	}
	if st.Pairs != 20 || st.Skipped != 12 || st.Asked != 8 {
		t.Fatalf("resumed stats %+v, want 12 skipped and 8 asked", st)
	}
	m, err := LoadMatrix(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Questions) != 10 || m.Incomplete != 0 {
		t.Fatalf("matrix has %d complete and %d incomplete questions, want 10 and 0", len(m.Questions), m.Incomplete)
	}
	for i := range m.Questions {
		if m.F1[i][0] != 1 || m.EM[i][0] != 1 || m.F1[i][1] != 0 {
			t.Errorf("question %s: F1 %v EM %v, want always=1 and never=0", m.Questions[i].ID, m.F1[i], m.EM[i])
		}
		if !(m.Cost[i][1] > m.Cost[i][0] && m.Cost[i][0] > 0) {
			t.Errorf("question %s: costs %v, want positive, never's above always's", m.Questions[i].ID, m.Cost[i])
		}
	}
	again, err := LoadMatrix(dir)
	if err != nil || again.Digest != m.Digest {
		t.Errorf("digest %s then %s (%v): want the same", m.Digest, again.Digest, err)
	}
	other, otherInfo := simPool(t, func(c *llmpool.Config) { c.Models[1].Sim.DefaultAccuracy = 0.5 })
	if _, err := Collect(ctx, dir, CollectOptions{Pool: other, Info: otherInfo, Questions: qs, Extract: extract}); !errors.Is(err, ErrOtherPool) {
		t.Errorf("another pool into the same folder: error %v, want ErrOtherPool", err)
	}
	_, latency := simPool(t, func(c *llmpool.Config) { c.Models[0].Sim.Latency = 1 })
	if latency.ID != info.ID {
		t.Error("simulated latency changed the pool identity; it does not change what models answer")
	}
}

// A cancelled collect records only the calls that finished and returns
// ctx's error; the next run finishes the rest.
func TestCollectCancelled(t *testing.T) {
	dir := t.TempDir()
	pool, info := simPool(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	_, err := Collect(ctx, dir, CollectOptions{Pool: pool, Info: info, Questions: questions(8), Extract: extract, Chunk: 4,
		Progress: func(done, total int) {
			if calls++; calls == 1 {
				cancel()
			}
		}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want context.Canceled", err)
	}
	st, err := Collect(context.Background(), dir, CollectOptions{Pool: pool, Info: info, Questions: questions(8), Extract: extract})
	if err != nil || st.Skipped != 4 || st.Asked != 12 {
		t.Fatalf("after cancel: stats %+v, error %v; want 4 skipped and 12 asked", st, err)
	}
	if _, err := LoadMatrix(t.TempDir()); !errors.Is(err, ErrNoOutcomes) || !strings.Contains(err.Error(), "recal collect") {
		t.Errorf("empty folder: error %v, want ErrNoOutcomes naming recal collect", err)
	}
}

// A collect whose every call fails (a wrong key: every call 401) is an
// error naming the cause, not a success that collected nothing; the
// failures stay in the file, asked again on the next run.
func TestCollectAllFailed(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"error":{"message":"invalid api key","type":"invalid_request_error"}}`)
	}))
	defer srv.Close()
	t.Setenv("RECAL_TEST_COLLECT_KEY", "sk-wrong")
	cfg := llmpool.Defaults()
	cfg.Cache = llmpool.CacheOff
	cfg.Models = []llmpool.ModelConfig{{Name: "m", Description: "d", Provider: "openai",
		OpenAI: &llmpool.OpenAIConfig{Model: "x", BaseURL: srv.URL, APIKeyEnv: "RECAL_TEST_COLLECT_KEY", MaxRetries: 0}}}
	pool, err := llmpool.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	info, err := PoolIdentity(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, err := Collect(context.Background(), t.TempDir(), CollectOptions{Pool: pool, Info: info, Questions: questions(3), Extract: extract})
	if !errors.Is(err, ErrAllFailed) || !strings.Contains(err.Error(), "all 3 calls") || !strings.Contains(err.Error(), "401") {
		t.Fatalf("collect with every call refused: %v (stats %+v); want ErrAllFailed naming the count and the first error", err, st)
	}
	if strings.Contains(err.Error(), "sk-wrong") {
		t.Errorf("error %q holds the key", err)
	}
}
