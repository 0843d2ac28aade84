package llmpool

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/outcomes"
)

// replayLog is a small outcome log: two questions, two models (one with
// reply text, tokens and cost; one with judgments only), in a temp file.
const replayLog = `{"dataset":"nq","question_id":"nq/1","question":"who wrote hamlet","golden_answers":["William Shakespeare","Shakespeare"],"model":"big","reply":"Hamlet was written by William Shakespeare.","correct":true,"input_tokens":20,"output_tokens":9,"cost":0.5,"latency_ms":250}
{"dataset":"nq","question_id":"nq/1","question":"who wrote hamlet","golden_answers":["William Shakespeare","Shakespeare"],"model":"small","correct":true}
{"dataset":"nq","question_id":"nq/2","question":"largest planet","golden_answers":["Jupiter"],"model":"big","reply":"Saturn is the largest.","correct":false}
{"dataset":"nq","question_id":"nq/2","question":"largest planet","golden_answers":["Jupiter"],"model":"small","correct":false}
{"dataset":"nq","question_id":"nq/3","question":"capital of france","golden_answers":["Paris"],"model":"big","reply":"It is Paris, the capital and largest city of France.","correct":true}
`

func writeLog(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "log.jsonl")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func replayModel(name, log string, r ReplayConfig) ModelConfig {
	r.Log = log
	return ModelConfig{Name: name, Description: "replayed " + name, PriceIn: 1, PriceOut: 2, Provider: "replay", Replay: &r}
}

func q(id, dataset string) *Question { return &Question{ID: id, Dataset: dataset} }

// A call is answered with what the log's model said to the call's question:
// its reply text, or the reply rendered from the judgment; tokens and cost
// from the log, else estimated and priced.
func TestReplayAnswersFromTheLog(t *testing.T) {
	log := writeLog(t, replayLog)
	p := newTestPool(t, testConfig(
		replayModel("Big", log, ReplayConfig{Model: "big"}),
		replayModel("small", log, ReplayConfig{}),
		replayModel("big-judged", log, ReplayConfig{Model: "big", Render: RenderJudgment}),
		replayModel("big-short", log, ReplayConfig{Model: "big", MaxReplyChars: 7}),
	))
	cases := []struct {
		model, id string
		text      string
		evidence  string // what the model wrote, when text is rendered from the judgment
		in, out   int
		cost      float64
		estimated bool
	}{
		{"big", "nq/1", "Hamlet was written by William Shakespeare.", "", 20, 9, 0.5, false},
		{"big", "nq/2", "Saturn is the largest.", "", 0, 0, 0, true},
		{"small", "nq/1", "The answer is William Shakespeare.", "", 0, 0, 0, true}, // no text: nothing else to show
		{"small", "nq/2", "The answer is Paris.", "", 0, 0, 0, true},               // no text: another question's golden answer
		{"big-judged", "nq/1", "The answer is William Shakespeare.", "Hamlet was written by William Shakespeare.", 20, 9, 0.5, false},
		{"big-judged", "nq/2", "The answer is Saturn.", "Saturn is the largest.", 0, 0, 0, true},                              // judged wrong: the answer the model stated
		{"big-judged", "nq/3", "The answer is Paris.", "It is Paris, the capital and largest city of France.", 0, 0, 0, true}, // output tokens: of what the model wrote
		{"big-short", "nq/1", "Hamlet", "", 20, 9, 0.5, false},
	}
	for _, c := range cases {
		t.Run(c.model+"/"+c.id, func(t *testing.T) {
			r := p.Call(context.Background(), Request{Model: c.model, Query: "anything at all", Question: q(c.id, "nq")})
			if r.Failed {
				t.Fatalf("failed: %v", r.Err)
			}
			if r.Text != c.text {
				t.Errorf("text %q, want %q (the logged outcome of this question and model)", r.Text, c.text)
			}
			if r.Evidence != c.evidence {
				t.Errorf("evidence %q, want %q (the logged reply when the text is rendered, else none)", r.Evidence, c.evidence)
			}
			if !c.estimated && (r.InputTokens != c.in || r.OutputTokens != c.out || r.Cost != c.cost || r.TokensEstimated) {
				t.Errorf("tokens %d/%d cost %v estimated %v, want the log's %d/%d and %v", r.InputTokens, r.OutputTokens, r.Cost, r.TokensEstimated, c.in, c.out, c.cost)
			}
			if c.estimated {
				wrote := c.text
				if row, _ := p.models[0].prov.(*replay).log.Lookup(c.id, "big"); c.model != "small" && row.Reply != nil {
					wrote = *row.Reply // the model's own words, rendered or not
				}
				if !r.TokensEstimated || r.OutputTokens != estimateTokens(wrote) {
					t.Errorf("tokens %d/%d estimated %v, want estimated output tokens %d (of %q)", r.InputTokens, r.OutputTokens, r.TokensEstimated, estimateTokens(wrote), wrote)
				}
				if want := cost(ModelInfo{PriceIn: 1, PriceOut: 2}, r.InputTokens, r.OutputTokens); r.Cost != want {
					t.Errorf("cost %v, want the model's prices times the tokens, %v", r.Cost, want)
				}
			}
		})
	}
}

// The sub-query's wording does not change a replayed reply, and two pools
// give byte-identical replies.
func TestReplayIsDeterministic(t *testing.T) {
	log := writeLog(t, replayLog)
	cfg := testConfig(replayModel("big", log, ReplayConfig{}))
	a, b := newTestPool(t, cfg), newTestPool(t, cfg)
	first := a.Call(context.Background(), Request{Model: "big", Query: "who wrote hamlet", Question: q("nq/1", "nq")})
	if first.Latency != 250*time.Millisecond {
		t.Errorf("latency %v, want the logged 250ms", first.Latency)
	}
	if r := a.Call(context.Background(), Request{Model: "big", Query: "x", Question: q("nq/2", "nq")}); r.Latency != 0 {
		t.Errorf("latency %v of a row without one, want 0 (wall time would make runs differ)", r.Latency)
	}
	for _, p := range []*Pool{a, b} {
		for _, query := range []string{"who wrote hamlet", "hamlet author?", "x"} {
			r := p.Call(context.Background(), Request{Model: "big", Query: query, Question: q("nq/1", "nq")})
			if r.Text != first.Text || r.Cost != first.Cost || r.InputTokens != first.InputTokens {
				t.Fatalf("reply %+v differs from %+v", r, first)
			}
		}
	}
}

func TestReplayFailures(t *testing.T) {
	log := writeLog(t, replayLog)
	p := newTestPool(t, testConfig(replayModel("big", log, ReplayConfig{})))
	cases := []struct {
		name string
		req  Request
		want error
		msg  string
	}{
		{"question not in the log", Request{Model: "big", Query: "q", Question: q("nq/9", "nq")}, ErrReplayMissing, `question "nq/9", model "big"`},
		{"no question", Request{Model: "big", Query: "q"}, ErrReplayNoQuestion, "big"},
		{"empty query", Request{Model: "big", Query: "  ", Question: q("nq/1", "nq")}, ErrEmptyQuery, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := p.Call(context.Background(), c.req)
			if !r.Failed || !errors.Is(r.Err, c.want) || !strings.Contains(r.Err.Error(), c.msg) {
				t.Fatalf("response %+v, want a failure wrapping %v naming %q", r, c.want, c.msg)
			}
			if r.Latency != 0 {
				t.Errorf("latency %v, want 0: wall time would make two replayed runs differ", r.Latency)
			}
		})
	}
}

// Replies never go through the response cache: even a read-only cache with
// nothing in it answers from the log.
func TestReplayBypassesTheCache(t *testing.T) {
	log := writeLog(t, replayLog)
	cfg := testConfig(replayModel("big", log, ReplayConfig{}))
	cfg.Cache, cfg.CacheDir = CacheReadOnly, t.TempDir()
	p := newTestPool(t, cfg)
	r := p.Call(context.Background(), Request{Model: "big", Query: "q", Question: q("nq/1", "nq")})
	if r.Failed || r.Cached {
		t.Fatalf("response %+v, want the log's reply, not a cache miss", r)
	}
	if entries, _ := os.ReadDir(cfg.CacheDir); len(entries) != 0 {
		t.Errorf("the cache directory got %d entries", len(entries))
	}
}

// A model the log lacks, an unreadable log and bad settings fail at New,
// naming the model and key.
func TestReplayNewErrors(t *testing.T) {
	log := writeLog(t, replayLog)
	bad := writeLog(t, `{"dataset":"nq"}`+"\n")
	cases := []struct {
		name string
		m    ModelConfig
		want string
	}{
		{"model not in the log", replayModel("gpt4", log, ReplayConfig{}), `pool.models[0] ("gpt4"): replay.model: ` + log + ` has no rows of model "gpt4" (models in the log: big, small)`},
		{"bad log", replayModel("big", bad, ReplayConfig{}), bad + `:1: field "question_id" is required`},
		{"missing log", replayModel("big", filepath.Join(t.TempDir(), "nope.jsonl"), ReplayConfig{}), "nope.jsonl: no such file"},
		{"no log", replayModel("big", "", ReplayConfig{}), "replay.log is required"},
		{"bad render", replayModel("big", log, ReplayConfig{Render: "html"}), `replay.render: "html" is not one of text, judgment`},
		{"section of another provider", ModelConfig{Name: "big", Description: "d", Provider: "sim", Replay: &ReplayConfig{Log: log}}, "a replay section is given but provider is \"sim\""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(testConfig(c.m))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New error %v, want one containing %q", err, c.want)
			}
		})
	}
}

// CheckReplay names the first question of the data its log lacks, before
// any call.
func TestCheckReplay(t *testing.T) {
	log := writeLog(t, replayLog)
	cfg := testConfig(replayModel("big", log, ReplayConfig{}), simModel("sim", SimConfig{}))
	if err := CheckReplay(cfg, []Question{*q("nq/1", "nq"), *q("nq/2", "nq")}); err != nil {
		t.Fatalf("every question is logged: %v", err)
	}
	err := CheckReplay(cfg, []Question{*q("nq/1", "nq"), *q("nq/7", "nq"), *q("nq/8", "nq")})
	if err == nil || !strings.Contains(err.Error(), `has no row of model "big" for question "nq/7" (2 of the 3 questions`) {
		t.Fatalf("error %v, want one naming nq/7 and counting 2 missing of 3", err)
	}
	err = CheckReplay(cfg, []Question{*q("nq/1", "triviaqa")})
	if err == nil || !strings.Contains(err.Error(), `question "nq/1" is of dataset "nq" in the log, "triviaqa" in the data`) {
		t.Fatalf("error %v, want a dataset mismatch", err)
	}
}

// A reply rendered from a right judgment states the golden answer the
// model's own reply holds, not whichever alias the list names first.
func TestSpokenGolden(t *testing.T) {
	cases := []struct {
		name   string
		golden []string
		reply  string
		want   string
	}{
		{"first alias said", []string{"Paris", "City of Light"}, "It is Paris.", "Paris"},
		{"a later alias said", []string{"Kamal kahn", "Octopussy", "Bond 13"}, `The title song was for "Octopussy" (1983).`, "Octopussy"},
		{"the longest alias said", []string{"Ford", "Gerald R. Ford", "Gerald Ford"}, "That was President Gerald R. Ford, in 1974.", "Gerald R. Ford"},
		{"equal lengths: the first listed", []string{"abc", "xyz"}, "xyz or abc", "abc"},
		{"as exact match reads it", []string{"The Beatles"}, "beatles!", "The Beatles"},
		{"whole words only", []string{"Ford", "Cat"}, "Affordable cats", "Ford"},
		{"none said: the first", []string{"", " Jupiter ", "Jove"}, "Saturn", "Jupiter"},
		{"no reply: the first", []string{"Jupiter", "Jove"}, "", "Jupiter"},
		{"an alias that normalises to nothing is never said", []string{"!!", "the"}, "!! the", "!!"},
		{"no golden answer", nil, "anything", ""},
		{"invalid UTF-8 reply", []string{"Jove"}, "\xff Jove \xfe", "Jove"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := SpokenGolden(c.golden, c.reply); got != c.want {
				t.Errorf("SpokenGolden(%q, %q) = %q, want %q", c.golden, c.reply, got, c.want)
			}
		})
	}

	log := writeLog(t, `{"dataset":"triviaqa","question_id":"triviaqa/1","question":"which bond film has all time high","golden_answers":["Kamal kahn","Octopussy"],"model":"gpt","reply":"Rita Coolidge sang All Time High for Octopussy.","correct":true}
`)
	p := newTestPool(t, testConfig(replayModel("gpt", log, ReplayConfig{Render: RenderJudgment})))
	r := p.Call(context.Background(), Request{Model: "gpt", Query: "q", Question: q("triviaqa/1", "triviaqa")})
	if r.Failed || r.Text != "The answer is Octopussy." {
		t.Errorf("rendered reply %q (failed %v), want the alias the model said", r.Text, r.Failed)
	}
}

// The answer a reply states, by StatedAnswers' documented rule.
func TestStatedAnswers(t *testing.T) {
	cases := []struct {
		name, reply, question string
		want                  []string
	}{
		{"a short reply is its own answer", "Wilhelm Röntgen", "who got the first nobel prize in physics", []string{"Wilhelm Röntgen"}},
		{"short, quoted, final period", `"Atomic."`, "which blondie song", []string{"Atomic"}},
		{"quotes first", `The nickname of the Merchant Navy's flag is the "Red Ensign."`, "what is the merchant navy flag called", []string{"Red Ensign"}}, // "Merchant Navy's": every content word is the question's
		{"question words dropped", "The first spacecraft to land on another planet was Viking 1, which landed on Mars in 1976.",
			"what was the first spacecraft to land on another planet", []string{"Viking 1", "Mars", "1976"}},
		{"runs join across of", "The song was written by the Bank of England choir in 1990.", "who wrote the song", []string{"Bank of England", "1990"}},
		{"a bracket ends a run", "The Bureau of Land Management (BLM) manages over 248 million acres.", "who manages public land",
			[]string{"Bureau of Land Management", "BLM", "248"}},
		{"openers are no answer", "I'm sorry, but I couldn't find it. However, Paris is likely.", "capital", []string{"Paris"}},
		{"after the copula when nothing is capitalised", "The name for this garment is a jubbah, worn by men.", "what is the garment called", []string{"a jubbah"}},
		{"initials do not end a sentence", "It was J. R. R. Tolkien who wrote it in full.", "who wrote it", []string{"J. R. R. Tolkien"}},
		{"a short sentence is no answer", "Saturn is the largest.", "largest planet", []string{"Saturn"}},
		{"nothing stated", "it depends on many things that vary a lot", "what", nil},
		{"empty", "   ", "what", nil},
		{"invalid UTF-8", "The answer was \xff Jove \xfe in the end of it all.", "who", []string{"Jove"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := StatedAnswers(c.reply, c.question)
			if strings.Join(got, "|") != strings.Join(c.want, "|") {
				t.Errorf("StatedAnswers(%q) = %q, want %q", c.reply, got, c.want)
			}
		})
	}
}

// Every row of the EVOUNA log renders into one template; a right reply
// scores an exact match and a wrong one never does, so the world keeps the
// people's judgments while its replies look alike.
func TestRenderedRepliesShareOneTemplate(t *testing.T) {
	l, err := outcomes.ReadFile("../data/outcomes/evouna/outcomes.jsonl.gz")
	if err != nil {
		t.Fatal(err)
	}
	r := NewReplayRenderer(l)
	for _, row := range l.Rows {
		text := r.Text(row, RenderJudgment)
		answer, ok := strings.CutPrefix(text, "The answer is ")
		if !ok || !strings.HasSuffix(answer, ".") || strings.ContainsAny(answer, "\n\t") {
			t.Fatalf("%s / %s: %q is not \"The answer is A.\" on one line", row.QuestionID, row.Model, text)
		}
		answer = strings.TrimSuffix(answer, ".")
		if strings.TrimSpace(answer) == "" {
			t.Fatalf("%s / %s: empty answer in %q", row.QuestionID, row.Model, text)
		}
		if row.Correct == nil || data.ExactMatch(row.Golden[0], row.Golden) == 0 {
			continue // no judgment, or a golden answer exact match cannot score ("A+" normalises to nothing)
		}
		if em := data.ExactMatch(answer, row.Golden) == 1; em != *row.Correct {
			t.Fatalf("%s / %s judged %v: rendered %q scores exact match %v; the rendered answer must score as people judged", row.QuestionID, row.Model, *row.Correct, text, em)
		}
	}
}

// A row judged wrong without reply text gets another question's golden
// answer (same dataset), never one of its own golden answers.
func TestBankAnswer(t *testing.T) {
	f, tr := false, true
	rows := []outcomes.Row{
		{Dataset: "nq", QuestionID: "nq/1", Question: "a", Golden: []string{"Paris"}, Model: "m", Correct: &f},
		{Dataset: "nq", QuestionID: "nq/2", Question: "b", Golden: []string{"Paris, France"}, Model: "m", Correct: &tr},
		{Dataset: "nq", QuestionID: "nq/3", Question: "c", Golden: []string{"  Jupiter. "}, Model: "m", Correct: &tr},
		{Dataset: "tq", QuestionID: "tq/1", Question: "d", Golden: []string{"Mars"}, Model: "m", Correct: &f},
	}
	var b strings.Builder
	if err := outcomes.Write(&b, rows); err != nil {
		t.Fatal(err)
	}
	l, err := outcomes.Read(strings.NewReader(b.String()), "bank.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	r := NewReplayRenderer(l)
	cases := []struct {
		row  outcomes.Row
		want string
	}{
		{l.Rows[0], "The answer is Jupiter."},                 // "Paris, France" holds Paris: skipped
		{l.Rows[2], "The answer is Jupiter."},                 // right: its own golden answer, trimmed
		{l.Rows[3], "The answer is " + ReplayNonAnswer + "."}, // no other question of its dataset
	}
	for _, c := range cases {
		if got := r.Text(c.row, RenderJudgment); got != c.want {
			t.Errorf("%s: %q, want %q", c.row.QuestionID, got, c.want)
		}
		if got := r.Text(c.row, RenderText); got != c.want {
			t.Errorf("%s in text mode (no reply text): %q, want %q", c.row.QuestionID, got, c.want)
		}
	}
}

// No reply text makes StatedAnswers panic or state an empty, multi-line or
// overlong answer.
func FuzzStatedAnswers(f *testing.F) {
	for _, s := range []string{"", "Paris", `The flag is the "Red Ensign."`, "I'm sorry. \xff (BLM) \"", "a is b, c", "J. R. R. Tolkien.", "“unclosed", "((((", "is is is"} {
		f.Add(s, "what is it")
	}
	f.Fuzz(func(t *testing.T, reply, question string) {
		for _, a := range StatedAnswers(reply, question) {
			if strings.TrimSpace(a) == "" || strings.ContainsAny(a, "\n\r\t") || len(strings.Fields(a)) > maxStatedWords {
				t.Fatalf("StatedAnswers(%q) stated %q", reply, a)
			}
		}
	})
}

// A logged reply kept as evidence is scrubbed of the pool's API keys as a
// reply is: a log that quotes a key never hands it on.
func TestReplayEvidenceIsScrubbed(t *testing.T) {
	const key = "sk-evidence-test-0123456789"
	t.Setenv("RECAL_TEST_EVIDENCE_KEY", key)
	log := writeLog(t, `{"dataset":"nq","question_id":"nq/1","question":"q","golden_answers":["Paris"],"model":"big","reply":"Paris, says `+key+`","correct":true}`+"\n")
	p := newTestPool(t, testConfig(
		replayModel("big", log, ReplayConfig{Render: RenderJudgment}),
		openaiModel("api", "http://127.0.0.1:1", func(o *OpenAIConfig) { o.APIKeyEnv = "RECAL_TEST_EVIDENCE_KEY" }),
	))
	r := p.Call(context.Background(), Request{Model: "big", Query: "q", Question: q("nq/1", "nq")})
	if r.Failed || r.Evidence != "Paris, says [redacted]" {
		t.Errorf("evidence %q (failed %v), want the logged reply with the key scrubbed", r.Evidence, r.Failed)
	}
}
