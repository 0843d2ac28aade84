package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/recal-project/recal/internal/outcomes"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/internal/testing/testpolicy"
	"github.com/recal-project/recal/llmpool"
)

// replayWorld is a hand-written world of real outcomes: question files for
// nq (train and test) and triviaqa (test), and an outcome log of two models
// under other names than EVOUNA's, "oracle" (reply text, with tokens and
// cost on some rows) and "guesser" (judgments without reply text).
type replayWorld struct {
	dir, log string
	// rows by (question id, model)
	rows map[[2]string]outcomes.Row
	// render renders the log's rows as provider replay does.
	render *llmpool.ReplayRenderer
}

var worldQuestions = []struct{ ds, split, id, q, golden string }{
	{"nq", "train", "t1", "who wrote hamlet?", "William Shakespeare"},
	{"nq", "train", "t2", "what is the capital of france?", "Paris"},
	{"nq", "train", "t3", "what is the largest planet?", "Jupiter"},
	{"nq", "train", "t4", "who painted the mona lisa?", "Leonardo da Vinci"},
	{"nq", "train", "t5", "what is the chemical symbol of gold?", "Au"},
	{"nq", "train", "t6", "how many legs does a spider have?", "eight"},
	{"nq", "test", "e1", "who discovered penicillin?", "Alexander Fleming"},
	{"nq", "test", "e2", "what is the tallest mountain?", "Mount Everest"},
	{"triviaqa", "test", "v1", "Which planet is known as the red planet?", "Mars"},
	{"triviaqa", "test", "v2", "Who wrote Pride and Prejudice?", "Jane Austen"},
}

func newReplayWorld(t *testing.T, skip string) replayWorld {
	t.Helper()
	w := replayWorld{dir: t.TempDir(), rows: map[[2]string]outcomes.Row{}}
	files := map[string]*bytes.Buffer{}
	var rows []outcomes.Row
	for i, q := range worldQuestions {
		key := q.ds + "/" + q.split
		if files[key] == nil {
			files[key] = &bytes.Buffer{}
		}
		b, _ := json.Marshal(map[string]any{"id": q.id, "question": q.q, "golden_answers": []string{q.golden}, "dataset": q.ds})
		files[key].Write(append(b, '\n'))
		id := q.ds + "/" + q.id
		if id == skip {
			continue
		}
		right := i%3 != 0
		reply := fmt.Sprintf("I believe it is %s.", q.golden)
		if !right {
			reply = "I believe it is Nobody Special."
		}
		oracle := outcomes.Row{Dataset: q.ds, QuestionID: id, Question: q.q, Golden: []string{q.golden}, Model: "oracle",
			Reply: &reply, Correct: &right, Judge: "hand-written"}
		if i%2 == 0 {
			in, out, cost := 40+i, 9, 0.001*float64(i+1)
			oracle.InputTokens, oracle.OutputTokens, oracle.Cost = &in, &out, &cost
		}
		guess := i%2 == 0
		guesser := outcomes.Row{Dataset: q.ds, QuestionID: id, Question: q.q, Golden: []string{q.golden}, Model: "guesser", Correct: &guess}
		rows = append(rows, oracle, guesser)
		w.rows[[2]string{id, "oracle"}], w.rows[[2]string{id, "guesser"}] = oracle, guesser
	}
	for key, b := range files {
		p := filepath.Join(w.dir, "qa", key+".jsonl")
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	w.log = filepath.Join(w.dir, "log.jsonl")
	if err := outcomes.WriteFile(w.log, rows); err != nil {
		t.Fatal(err)
	}
	l, err := outcomes.ReadFile(w.log)
	if err != nil {
		t.Fatal(err)
	}
	w.render = llmpool.NewReplayRenderer(l)
	return w
}

// worldConfig writes a config of a micro policy on the world's questions
// with the given [[pool.models]] text, and returns its path.
func worldConfig(t *testing.T, dir, models string, extra string) string {
	t.Helper()
	return worldConfigWith(t, dir, testpolicy.Micro(t, "../..", 1), models, extra, 1, 8)
}

// worldConfigWith is worldConfig with a given policy, warm-up steps and
// router token limits.
func worldConfigWith(t *testing.T, dir, ck, models, extra string, sftSteps, tokens int) string {
	t.Helper()
	tmpl, _ := filepath.Abs("../../router/prompt-compact.tmpl")
	text := fmt.Sprintf(`[policy]
checkpoint = %q
threads = 2
[data]
dir = "qa"
train = ["nq"]
test = ["nq", "triviaqa"]
val_per_dataset = 2
test_per_dataset = 0
%s
[pool]
cache = "off"
%s
[router]
max_turns = 1
turn_tokens = %d
info_tokens = %d
prompt_template = %q
[sft]
steps = %d
batch_size = 4
lr = 3e-3
answer_weight = 3.0
[train]
steps = 2
batch_size = 2
group_size = 2
micro_batch = 4
checkpoint_every = 2
validate_every = 2
[eval]
batch = 8
`, ck, extra, models, tokens, tokens, tmpl, sftSteps)
	path := filepath.Join(dir, fmt.Sprintf("world-%d.toml", len(models)))
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

const worldReplayModels = `[[pool.models]]
name = "oracle"
description = "logged model with replies"
price_in = 1.0
price_out = 4.0
provider = "replay"
  [pool.models.replay]
  log = "log.jsonl"
[[pool.models]]
name = "guesser"
description = "logged model, judgments only"
price_in = 0.5
price_out = 0.5
provider = "replay"
  [pool.models.replay]
  log = "log.jsonl"
  render = "judgment"
`

// readResults reads a results-<router>.jsonl of recal eval.
func readResults(t *testing.T, path string) []rollout.QuestionResult {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []rollout.QuestionResult
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var r rollout.QuestionResult
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, r)
	}
	return out
}

// A config naming a hand-written log of other models (one with judgments
// only) trains and evaluates with no code change; two training runs write
// byte-identical rollouts.jsonl and validation.jsonl; eval's direct routers
// get, per question, the logged reply of the model they call (or the
// reply rendered from its judgment) at the logged or priced cost.
func TestReplayWorldTrainsAndEvaluates(t *testing.T) {
	w := newReplayWorld(t, "")
	// A tiny policy with a copy circuit and a short warm-up on
	// demonstrations (which are replayed calls too), so that the GRPO
	// rollouts do call the replayed models.
	ck := filepath.Join(w.dir, "tiny")
	if code, _, stderr := runCLI(t, "--threads", "2", "policy", "init", "--preset", "tiny", "--tokenizer", "../../tokenizer/qwen2.5",
		"--out", ck, "--copy-circuit", "--trim-corpus", filepath.Join(w.dir, "qa"), "--trim-corpus", "../../router/prompt-compact.tmpl",
		"--trim-corpus", w.log); code != 0 {
		t.Fatalf("policy init: exit %d: %s", code, stderr)
	}
	cfg := worldConfigWith(t, w.dir, ck, worldReplayModels, "", 30, 48)
	runs := []string{filepath.Join(w.dir, "run-a"), filepath.Join(w.dir, "run-b")}
	for _, run := range runs {
		code, _, stderr := runCLI(t, "--threads", "2", "train", "--config", cfg, "--run-dir", run)
		if code != 0 {
			t.Fatalf("train: exit %d: %s", code, stderr)
		}
	}
	for _, f := range []string{"rollouts.jsonl", "validation.jsonl"} {
		if !bytes.Equal(readFile(t, filepath.Join(runs[0], f)), readFile(t, filepath.Join(runs[1], f))) {
			t.Errorf("%s differs between two runs of the same replay config", f)
		}
	}
	b, _ := os.ReadFile(filepath.Join(runs[0], "rollouts.jsonl"))
	if n := strings.Count(string(b), "I believe it is") + strings.Count(string(b), "The answer is"); n == 0 {
		t.Errorf("rollouts.jsonl holds no replayed reply: the determinism above says nothing about replay")
	} else {
		t.Logf("rollouts.jsonl: %d replayed replies", n)
	}
	out := filepath.Join(w.dir, "eval")
	code, stdout, stderr := runCLI(t, "--threads", "2", "eval", "--config", cfg, "--checkpoint", runs[0], "--datasets", "nq,triviaqa",
		"--routers", "policy,largest,random", "--out", out)
	if code != 0 {
		t.Fatalf("eval: exit %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "largest") {
		t.Errorf("eval printed no table row of the largest router: %s", stdout)
	}
	prices := map[string][2]float64{"oracle": {1, 4}, "guesser": {0.5, 0.5}}
	render := map[string]string{"oracle": llmpool.RenderText, "guesser": llmpool.RenderJudgment}
	calls := 0
	for _, router := range []string{"largest", "random"} {
		results := readResults(t, filepath.Join(out, "results-"+router+".jsonl"))
		if len(results) != 4 {
			t.Fatalf("%s: %d results, want the 4 test questions", router, len(results))
		}
		for _, r := range results {
			if len(r.Calls) != 1 {
				t.Fatalf("%s: question %s: %d calls, want 1", router, r.ID, len(r.Calls))
			}
			c := r.Calls[0]
			row, ok := w.rows[[2]string{r.ID, c.Model}]
			if !ok {
				t.Fatalf("%s: question %s called %q, not a logged model", router, r.ID, c.Model)
			}
			if want := w.render.Text(row, render[c.Model]); c.Reply != want {
				t.Errorf("%s: question %s, model %s: reply %q, want the logged %q", router, r.ID, c.Model, c.Reply, want)
			}
			want := 0.0
			if row.Cost != nil {
				want = *row.Cost
			} else {
				// no logged cost: estimated tokens (4 characters each, rounded
				// up; the question plus 8 of chat overhead) times the prices
				p := prices[c.Model]
				in, out := (len([]rune(row.Question))+3)/4+8, (len([]rune(c.Reply))+3)/4
				want = (float64(in)*p[0] + float64(out)*p[1]) / 1e6
			}
			if c.Cost != want || r.Cost != want {
				t.Errorf("%s: question %s, model %s: cost %v (question %v), want %v", router, r.ID, c.Model, c.Cost, r.Cost, want)
			}
			calls++
		}
	}
	if calls != 8 {
		t.Errorf("%d replayed calls checked, want 8", calls)
	}
}

// A question of [data] missing from the log stops the run at start, naming
// the question, before any training.
func TestReplayMissingQuestionFailsAtStart(t *testing.T) {
	w := newReplayWorld(t, "nq/t3")
	cfg := worldConfig(t, w.dir, worldReplayModels, "")
	run := filepath.Join(w.dir, "run")
	code, _, stderr := runCLI(t, "--threads", "2", "train", "--config", cfg, "--run-dir", run)
	if code != 2 || !strings.Contains(stderr, `no row of model "oracle" for question "nq/t3"`) {
		t.Fatalf("train: exit %d, stderr %s; want exit 2 naming nq/t3", code, stderr)
	}
	if _, err := os.Stat(filepath.Join(run, "rollouts.jsonl")); err == nil {
		t.Error("the run started training")
	}
}

// fakeOpenAI answers every chat completion with a text that depends only on
// the model and the query, and reports usage.
func fakeOpenAI(t *testing.T) *httptest.Server {
	t.Helper()
	answers := []string{"Paris", "Jupiter", "Mars", "Jane Austen", "Alexander Fleming", "eight"}
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var body struct {
			Model    string `json:"model"`
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		if err := json.Unmarshal(raw, &body); err != nil || len(body.Messages) == 0 {
			http.Error(rw, "bad request", http.StatusBadRequest)
			return
		}
		q := body.Messages[len(body.Messages)-1].Content
		h := fnv.New32a()
		fmt.Fprintf(h, "%s|%s", body.Model, q)
		text := fmt.Sprintf("[%s] The answer is %s.", body.Model, answers[h.Sum32()%uint32(len(answers))])
		rw.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(rw, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":0}}`,
			text, 10+len(q)/3, 6+int(h.Sum32()%5))
	}))
	t.Cleanup(srv.Close)
	return srv
}

// The outcome matrix `recal collect` makes against an OpenAI-compatible
// server, converted by `recal outcomes from-collect`, replays what the
// server said: eval's direct routers get the same per-question answers,
// replies and costs over replay as against the server.
func TestCollectThenReplay(t *testing.T) {
	w := newReplayWorld(t, "")
	srv := fakeOpenAI(t)
	api := func(name string, price float64) string {
		return fmt.Sprintf(`[[pool.models]]
name = %q
description = "served model %s"
price_in = %v
price_out = %v
provider = "openai"
  [pool.models.openai]
  base_url = "%s/v1"
  model = "test/%s"
  max_retries = -1
`, name, name, price, 2*price, srv.URL, name)
	}
	replay := func(name string, price float64) string {
		return fmt.Sprintf(`[[pool.models]]
name = %q
description = "served model %s"
price_in = %v
price_out = %v
provider = "replay"
  [pool.models.replay]
  log = "collected.jsonl"
`, name, name, price, 2*price)
	}
	// collect asks the training split: point it at the test questions, so
	// that what eval asks is what was collected.
	files := `[data.files]
"nq/train" = "nq/test.jsonl"
"triviaqa/train" = "triviaqa/test.jsonl"`
	live := worldConfig(t, w.dir, api("alpha", 1)+api("beta", 3), files)
	// train = both datasets so collect covers them; no validation hold-out
	b, _ := os.ReadFile(live)
	text := strings.Replace(string(b), `train = ["nq"]`, `train = ["nq", "triviaqa"]`, 1)
	text = strings.Replace(text, "val_per_dataset = 2", "val_per_dataset = 0", 1)
	os.WriteFile(live, []byte(text), 0o644)
	collected := filepath.Join(w.dir, "collect")
	if code, _, stderr := runCLI(t, "--threads", "2", "collect", "--config", live, "--out", collected); code != 0 {
		t.Fatalf("collect: exit %d: %s", code, stderr)
	}
	if code, _, stderr := runCLI(t, "outcomes", "from-collect", "--dir", collected, "--out", filepath.Join(w.dir, "collected.jsonl")); code != 0 {
		t.Fatalf("outcomes from-collect: exit %d: %s", code, stderr)
	}
	rep := strings.Replace(text, api("alpha", 1)+api("beta", 3), replay("alpha", 1)+replay("beta", 3), 1)
	replayed := filepath.Join(w.dir, "replayed.toml")
	os.WriteFile(replayed, []byte(rep), 0o644)
	ck := testpolicy.Micro(t, "../..", 1)
	outs := map[string]string{}
	for name, cfg := range map[string]string{"live": live, "replay": replayed} {
		outs[name] = filepath.Join(w.dir, "eval-"+name)
		code, _, stderr := runCLI(t, "--threads", "2", "eval", "--config", cfg, "--checkpoint", ck, "--datasets", "nq,triviaqa",
			"--routers", "largest,random", "--out", outs[name])
		if code != 0 {
			t.Fatalf("eval over %s: exit %d: %s", name, code, stderr)
		}
	}
	for _, router := range []string{"largest", "random"} {
		live, rep := readResults(t, filepath.Join(outs["live"], "results-"+router+".jsonl")), readResults(t, filepath.Join(outs["replay"], "results-"+router+".jsonl"))
		if len(live) != 4 || len(rep) != len(live) {
			t.Fatalf("%s: %d live and %d replayed results, want 4 each", router, len(live), len(rep))
		}
		for i := range live {
			a, b := live[i], rep[i]
			if a.ID != b.ID || a.Answer != b.Answer || a.Cost != b.Cost || a.F1 != b.F1 || len(a.Calls) != 1 || len(b.Calls) != 1 ||
				a.Calls[0].Model != b.Calls[0].Model || a.Calls[0].Reply != b.Calls[0].Reply {
				t.Errorf("%s: question %s: live answer %q cost %v calls %+v; replayed %s answer %q cost %v calls %+v",
					router, a.ID, a.Answer, a.Cost, a.Calls, b.ID, b.Answer, b.Cost, b.Calls)
			}
		}
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
