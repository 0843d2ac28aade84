package llmpool

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"

	"golang.org/x/sync/semaphore"

	"github.com/recal-project/recal/internal/httpretry"
)

// errSimFailure is the error of a simulated provider failure (sim.failure_rate).
var errSimFailure = errors.New("llmpool: simulated provider failure (sim.failure_rate)")

// sim is a SIMULATED model for offline runs and tests: no network, no
// language model. It answers by the rule in the package doc ("Simulated
// models").
type sim struct {
	wire       *semaphore.Weighted // the pool's max_concurrency, held during the latency
	name       string
	cfg        SimConfig
	accuracy   map[string]float64 // lowercased dataset -> probability
	bank       map[string][]string
	bankDigest string
}

func newSim(m ModelConfig, env providerEnv) (provider, error) {
	s := &sim{wire: env.wire, name: m.Name, cfg: *m.Sim, accuracy: map[string]float64{}, bank: map[string][]string{}}
	for k, v := range m.Sim.Accuracy {
		s.accuracy[strings.ToLower(k)] = v
	}
	h := sha256.New()
	datasets := make([]string, 0, len(env.answerBank))
	for d := range env.answerBank {
		datasets = append(datasets, d)
	}
	slices.Sort(datasets)
	for _, d := range datasets {
		ld := strings.ToLower(d)
		for _, a := range env.answerBank[d] {
			if strings.TrimSpace(a) != "" {
				s.bank[ld] = append(s.bank[ld], a)
			}
		}
		fmt.Fprintf(h, "%q:%q\n", ld, s.bank[ld])
	}
	s.bankDigest = hex.EncodeToString(h.Sum(nil))
	return s, nil
}

func (s *sim) close() {}

// simKey is the cache key of a sim call: everything its reply depends on.
type simKey struct {
	Model           string             `json:"model"`
	Seed            int64              `json:"seed"`
	Accuracy        map[string]float64 `json:"accuracy"`
	DefaultAccuracy float64            `json:"default_accuracy"`
	TokensIn        int                `json:"tokens_in"`
	TokensOut       int                `json:"tokens_out"`
	FailureRate     float64            `json:"failure_rate"`
	AnswerBank      string             `json:"answer_bank"`
	QuestionID      string             `json:"question_id"`
	Dataset         string             `json:"dataset"`
	Question        string             `json:"question"`
	Golden          []string           `json:"golden"`
	Query           string             `json:"query"`
	IgnoreQuery     bool               `json:"ignore_query,omitempty"`
}

func (s *sim) cacheKey(call providerCall) any {
	k := simKey{
		Model: s.name, Seed: s.cfg.Seed, Accuracy: s.accuracy, DefaultAccuracy: s.cfg.DefaultAccuracy,
		TokensIn: s.cfg.TokensIn, TokensOut: s.cfg.TokensOut, FailureRate: s.cfg.FailureRate,
		AnswerBank: s.bankDigest, Query: call.Query, IgnoreQuery: s.cfg.IgnoreQuery,
	}
	if q := call.Question; q != nil {
		k.QuestionID, k.Dataset, k.Question, k.Golden = q.ID, q.Dataset, q.Text, q.Golden
	}
	return k
}

func (s *sim) complete(ctx context.Context, call providerCall) (completion, error) {
	// The simulated request is out for sim.latency.
	if err := s.wire.Acquire(ctx, 1); err != nil {
		return completion{}, err
	}
	err := httpretry.Sleep(ctx, s.cfg.Latency)
	s.wire.Release(1)
	if err != nil {
		return completion{}, err
	}
	if s.cfg.FailureRate > 0 && s.draw(call, "fail") < s.cfg.FailureRate {
		return completion{}, fmt.Errorf("llmpool: model %q: %w", s.name, errSimFailure)
	}
	answer := s.wrongAnswer(call)
	if golden := firstGolden(call.Question); golden != "" && s.draw(call, "correct") < s.pCorrect(call) {
		answer = golden
	}
	text := fmt.Sprintf("[simulated %s] The answer is %s.", s.name, answer)
	c := completion{Text: text, InputTokens: s.cfg.TokensIn, OutputTokens: s.cfg.TokensOut, Attempts: 1}
	if c.InputTokens == 0 {
		c.InputTokens = estimateTokens(call.Query) + chatOverheadTokens
	}
	if c.OutputTokens == 0 {
		c.OutputTokens = estimateTokens(text)
	}
	return c, nil
}

// pCorrect is accuracy[dataset] times the relevance of the query (1 with
// ignore_query).
func (s *sim) pCorrect(call providerCall) float64 {
	q := call.Question
	if q == nil {
		return 0
	}
	acc, ok := s.accuracy[strings.ToLower(q.Dataset)]
	if !ok {
		acc = s.cfg.DefaultAccuracy
	}
	if s.cfg.IgnoreQuery {
		return acc
	}
	return acc * relevance(q.Text, call.Query)
}

// relevance is the fraction of the question's content words present in the
// query (step 1 of the rule on sim).
func relevance(question, query string) float64 {
	qw := words(query)
	if len(qw) == 0 {
		return 0
	}
	content := 0
	found := 0
	for w := range words(question) {
		if simStopWords[w] {
			continue
		}
		content++
		if qw[w] {
			found++
		}
	}
	if content == 0 {
		return 1
	}
	return float64(found) / float64(content)
}

// words returns the set of lowercased maximal runs of letters and digits.
func words(s string) map[string]bool {
	set := map[string]bool{}
	for _, w := range strings.FieldsFunc(strings.ToLower(s), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r)
	}) {
		set[w] = true
	}
	return set
}

// simStopWords are not content words: English function words and question
// words, so "who wrote Hamlet" and "Hamlet author" share "hamlet".
var simStopWords = func() map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields(`a an the of in on at to for by with from into onto about as and or but nor not no
		is are was were be been being am do does did done has have had having will would shall should can could may might must
		what which who whom whose when where why how that this these those there here it its it's he she they them his her
		their our your my me we you i s t than then so if also any some all each both either neither other such same
		very just only own most more much many few name named called`) {
		m[w] = true
	}
	return m
}()

// firstGolden returns the first non-empty golden answer of q, or "".
func firstGolden(q *Question) string {
	if q == nil {
		return ""
	}
	for _, g := range q.Golden {
		if g = strings.TrimSpace(g); g != "" {
			return g
		}
	}
	return ""
}

// wrongAnswer picks a deterministic answer that matches no golden answer
// (step 4 of the rule on sim).
func (s *sim) wrongAnswer(call providerCall) string {
	var golden []string
	dataset := ""
	if q := call.Question; q != nil {
		dataset = strings.ToLower(q.Dataset)
		for _, g := range q.Golden {
			if n := normalizeAnswer(g); n != "" {
				golden = append(golden, n)
			}
		}
	}
	ok := func(a string) bool {
		n := normalizeAnswer(a)
		if n == "" {
			return false
		}
		for _, g := range golden {
			if n == g || strings.Contains(" "+n+" ", " "+g+" ") {
				return false
			}
		}
		return true
	}
	if bank := s.bank[dataset]; len(bank) > 0 {
		start := int(s.hash(call, "wrong") % uint64(len(bank)))
		for i := range bank {
			if a := strings.TrimSpace(bank[(start+i)%len(bank)]); ok(a) {
				return a
			}
		}
	}
	for i := 0; ; i++ {
		if a := fakeName(s.hash(call, fmt.Sprintf("fake%d", i))); ok(a) {
			return a
		}
	}
}

var (
	fakeOnsets = []string{"b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr", "kr", "st", "th"}
	fakeVowels = []string{"a", "e", "i", "o", "u", "ai", "ei", "ou"}
	fakeCodas  = []string{"", "n", "r", "l", "s", "th", "nd", "rk"}
)

// fakeName makes a name of two invented capitalised words from h.
func fakeName(h uint64) string {
	pick := func(list []string) string {
		v := list[h%uint64(len(list))]
		h /= uint64(len(list))
		return v
	}
	var name []string
	for range 2 {
		syllables := 2 + int(h%2)
		h /= 2
		var w strings.Builder
		for range syllables {
			w.WriteString(pick(fakeOnsets))
			w.WriteString(pick(fakeVowels))
		}
		w.WriteString(pick(fakeCodas))
		word := w.String()
		name = append(name, strings.ToUpper(word[:1])+word[1:])
	}
	return strings.Join(name, " ")
}

// hash is the simulator's deterministic source: SHA-256 of the seed, the
// model name, the question id and dataset, the query and a purpose tag.
func (s *sim) hash(call providerCall, purpose string) uint64 {
	h := sha256.New()
	var seed [8]byte
	binary.LittleEndian.PutUint64(seed[:], uint64(s.cfg.Seed))
	h.Write(seed[:])
	id, dataset := "", ""
	if q := call.Question; q != nil {
		id, dataset = q.ID, q.Dataset
	}
	for _, part := range []string{s.name, id, dataset, call.Query, purpose} {
		fmt.Fprintf(h, "%d:%s", len(part), part)
	}
	return binary.LittleEndian.Uint64(h.Sum(nil))
}

// draw is hash as a uniform number in [0, 1).
func (s *sim) draw(call providerCall, purpose string) float64 {
	return float64(s.hash(call, purpose)>>11) / (1 << 53)
}

// normalizeAnswer is SQuAD normalisation: lowercase, drop punctuation, drop
// the words a/an/the, collapse whitespace.
func normalizeAnswer(s string) string {
	s = strings.ToLower(s)
	s = strings.Map(func(r rune) rune {
		if unicode.IsPunct(r) || unicode.IsSymbol(r) {
			return -1
		}
		return r
	}, s)
	f := strings.Fields(s)
	out := f[:0]
	for _, w := range f {
		if w != "a" && w != "an" && w != "the" {
			out = append(out, w)
		}
	}
	return strings.Join(out, " ")
}
