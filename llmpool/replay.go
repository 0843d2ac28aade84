package llmpool

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/outcomes"
)

// Render modes of replay.render.
const (
	// RenderText replies with the logged reply text, or with the reply
	// rendered from the judgment when the log has no text.
	RenderText = "text"
	// RenderJudgment always replies with the reply rendered from the
	// judgment (see the package doc, "Replayed models").
	RenderJudgment = "judgment"
)

// Defaults of [pool.models.replay].
const (
	// DefaultReplayMaxReplyChars bounds a replayed reply, in code points:
	// about openai.max_tokens' 512 tokens at 4 characters per token.
	DefaultReplayMaxReplyChars = 2048
	// ReplayNonAnswer is the answer rendered for a row judged wrong when the
	// log holds no other answer of its dataset to draw one from
	// (ReplayRenderer.Text).
	ReplayNonAnswer = "I don't know"
)

var (
	// ErrReplayNoQuestion: a replayed model was called without the question
	// being routed, so there is no logged answer to give.
	ErrReplayNoQuestion = errors.New("llmpool: replay needs the question being routed")
	// ErrReplayMissing: the outcome log has no row for the (question, model)
	// of a call.
	ErrReplayMissing = errors.New("llmpool: replay: no logged outcome")
)

// ReplayConfig is the [pool.models.replay] table of a model answered from an
// outcome log (package outcomes). The rule it answers by is in the package
// doc ("Replayed models").
type ReplayConfig struct {
	// Log is the outcome log (JSON Lines, docs/outcomes.md). A relative path
	// in a config file is resolved against the file's folder. Required.
	Log string `toml:"log"`
	// Model is the model's name in the log. Default: the pool name.
	Model string `toml:"model"`
	// Render is "text" (the logged reply; rendered from the judgment when
	// the row has no reply) or "judgment" (always rendered from the
	// judgment, "The answer is A.", A a golden answer when judged right and
	// the reply's own answer when wrong). Default "text".
	Render string `toml:"render"`
	// MaxReplyChars cuts a reply to this many code points. Default 2048.
	MaxReplyChars int `toml:"max_reply_chars"`
}

// SetDefaults fills the zero fields of r with their defaults; model is the
// pool name.
func (r *ReplayConfig) SetDefaults(model string) {
	if r.Model == "" {
		r.Model = model
	}
	if r.Render == "" {
		r.Render = RenderText
	}
	if r.MaxReplyChars == 0 {
		r.MaxReplyChars = DefaultReplayMaxReplyChars
	}
}

func (r *ReplayConfig) validate() error {
	switch {
	case strings.TrimSpace(r.Log) == "":
		return fmt.Errorf("replay.log is required (an outcome log, docs/outcomes.md)")
	case strings.TrimSpace(r.Model) != r.Model || r.Model == "":
		return fmt.Errorf("replay.model: %q: want a name without surrounding spaces", r.Model)
	case r.Render != RenderText && r.Render != RenderJudgment:
		return fmt.Errorf("replay.render: %q is not one of %s, %s", r.Render, RenderText, RenderJudgment)
	case r.MaxReplyChars < 1:
		return fmt.Errorf("replay.max_reply_chars: %d, want >= 1", r.MaxReplyChars)
	}
	return nil
}

// replay answers a call about question q with what the log's model said to
// q. No network; the same call always gets the same reply.
type replay struct {
	name   string
	cfg    ReplayConfig
	log    *outcomes.Log
	render *ReplayRenderer
}

// logBook reads each outcome log once per New, however many models use it,
// with one renderer per log (its answer bank is the log's).
type logBook map[string]*ReplayRenderer

func (b logBook) open(path string) (*outcomes.Log, error) {
	r, err := b.renderer(path)
	if err != nil {
		return nil, err
	}
	return r.log, nil
}

func (b logBook) renderer(path string) (*ReplayRenderer, error) {
	if r, ok := b[path]; ok {
		return r, nil
	}
	l, err := outcomes.ReadFile(path)
	if err != nil {
		return nil, err
	}
	b[path] = NewReplayRenderer(l)
	return b[path], nil
}

func newReplay(m ModelConfig, env providerEnv) (provider, error) {
	rr, err := env.logs.renderer(m.Replay.Log)
	if err != nil {
		return nil, fmt.Errorf("replay.log: %w", err)
	}
	l := rr.log
	models := l.Models()
	found := false
	for _, name := range models {
		found = found || name == m.Replay.Model
	}
	if !found {
		return nil, fmt.Errorf("replay.model: %s has no rows of model %q (models in the log: %s)", m.Replay.Log, m.Replay.Model, strings.Join(models, ", "))
	}
	return &replay{name: m.Name, cfg: *m.Replay, log: l, render: rr}, nil
}

func (r *replay) close() {}

// offline marks a provider answering from a file (see offlineProvider).
func (r *replay) offline() {}

func (r *replay) cacheKey(call providerCall) any { return nil }

func (r *replay) complete(ctx context.Context, call providerCall) (completion, error) {
	if err := ctx.Err(); err != nil {
		return completion{}, err
	}
	if call.Query == "" {
		return completion{Attempts: 1}, ErrEmptyQuery
	}
	q := call.Question
	if q == nil || q.ID == "" {
		return completion{Attempts: 1}, fmt.Errorf("%w (model %q)", ErrReplayNoQuestion, r.name)
	}
	row, ok := r.log.Lookup(q.ID, r.cfg.Model)
	if !ok {
		return completion{Attempts: 1}, fmt.Errorf("%w in %s for question %q, model %q", ErrReplayMissing, r.cfg.Log, q.ID, r.cfg.Model)
	}
	return r.answer(row), nil
}

// quote is what a call about q costs: the logged row's reply, whatever the
// sub-query (see Pool.DearestCall); false when the log has no row.
func (r *replay) quote(q *Question) (completion, bool) {
	if q == nil || q.ID == "" {
		return completion{}, false
	}
	row, ok := r.log.Lookup(q.ID, r.cfg.Model)
	if !ok {
		return completion{}, false
	}
	return r.answer(row), true
}

// answer is the reply a call gets from a logged row: its text, tokens,
// cost and latency.
func (r *replay) answer(row outcomes.Row) completion {
	text := strings.TrimSpace(cutRunes(strings.TrimSpace(r.render.Text(row, r.cfg.Render)), r.cfg.MaxReplyChars))
	c := completion{Text: text, Attempts: 1}
	if row.Reply != nil && r.cfg.Render != RenderText {
		// The render is what the policy reads; agreement is read on what
		// the model wrote (Response.Evidence).
		c.Evidence = strings.TrimSpace(cutRunes(strings.TrimSpace(*row.Reply), r.cfg.MaxReplyChars))
	}
	if row.InputTokens != nil {
		c.InputTokens = *row.InputTokens
	} else {
		c.InputTokens, c.Estimated = estimateTokens(row.Question)+chatOverheadTokens, true
	}
	switch {
	case row.OutputTokens != nil:
		c.OutputTokens = *row.OutputTokens
	case row.Reply != nil:
		// What the model wrote, not the rendered reply, is what it cost.
		c.OutputTokens, c.Estimated = estimateTokens(strings.TrimSpace(*row.Reply)), true
	default:
		c.OutputTokens, c.Estimated = estimateTokens(text), true
	}
	if row.Cost != nil {
		cost := *row.Cost
		c.Cost = &cost
	}
	var lat time.Duration // the lookup's own time is noise: 0 unless logged
	if row.LatencyMS != nil {
		lat = time.Duration(*row.LatencyMS * float64(time.Millisecond))
	}
	c.Latency = &lat
	return c
}

// ReplayVersion changes when a replayed model answers a logged row
// differently (eval's identity of a pool with replayed models holds it, so
// results made under an earlier rule are not resumed). 2: a rendered right
// answer states the golden answer the model's own reply holds (before: the
// first golden answer). 3: right and wrong replies are rendered alike, "The
// answer is A." (ReplayRenderer.Text; before, a wrong reply kept the model's
// prose or read "I don't know.", which gave the judgment away).
const ReplayVersion = 3

// SpokenGolden is the golden answer a reply states: of the golden answers
// whose normalised text (data.Normalize, as exact match reads it) occurs in
// the normalised reply as whole words, the longest ("Gerald R. Ford" over
// "Ford"; the first listed of equal length); when none occurs (or there is
// no reply), the first non-empty golden answer. A list of aliases, such as
// TriviaQA's, is in no particular order: its first may be one no model
// would say ("Kamal kahn" for a reply naming "Octopussy"), so a reply
// rendered from a judgment states the alias the judged model used.
func SpokenGolden(golden []string, reply string) string {
	said := " " + data.Normalize(reply) + " "
	best, bestLen := "", 0
	for _, g := range golden {
		g = strings.TrimSpace(g)
		n := data.Normalize(g)
		if n == "" || len(n) <= bestLen || !strings.Contains(said, " "+n+" ") {
			continue
		}
		best, bestLen = g, len(n)
	}
	if best == "" {
		return firstGolden(&Question{Golden: golden})
	}
	return best
}

// CheckReplay reports, before any call, the questions that a replayed model
// of cfg could not answer: the first (question, model) missing from its log,
// with the count of misses, or a question whose dataset differs from the
// log's. Models of other providers are not looked at. cfg's paths are used
// as they are (resolve them first).
func CheckReplay(cfg Config, qs []Question) error {
	logs := logBook{}
	for i, m := range cfg.Models {
		if m.Provider != "replay" || m.Replay == nil {
			continue
		}
		rc := *m.Replay
		rc.SetDefaults(m.Name)
		l, err := logs.open(rc.Log)
		if err != nil {
			return fmt.Errorf("llmpool: pool.models[%d] (%q): replay.log: %w", i, m.Name, err)
		}
		missing, first := 0, ""
		for _, q := range qs {
			row, ok := l.Lookup(q.ID, rc.Model)
			if !ok {
				if missing == 0 {
					first = q.ID
				}
				missing++
				continue
			}
			if !strings.EqualFold(row.Dataset, q.Dataset) {
				return fmt.Errorf("llmpool: pool.models[%d] (%q): replay.log %s: question %q is of dataset %q in the log, %q in the data",
					i, m.Name, rc.Log, q.ID, row.Dataset, q.Dataset)
			}
		}
		if missing > 0 {
			return fmt.Errorf("llmpool: pool.models[%d] (%q): replay.log %s has no row of model %q for question %q (%d of the %d questions of [data] are missing)",
				i, m.Name, rc.Log, rc.Model, first, missing, len(qs))
		}
	}
	return nil
}
