package llmpool

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/outcomes"
)

// A replayed reply rendered from a judgment must tell the policy no more
// about correctness than a real reply would: right and wrong replies share
// one template, "The answer is A.", and differ only in A (the package doc,
// "Replayed models", states the rule; docs/outcomes.md shows it measured
// with package leakage).

// maxStatedWords bounds a stated answer taken out of a reply, in words.
const maxStatedWords = 8

// shortReplyWords: a reply of at most this many words is an answer as it
// stands (FiD's replies are spans: "Wilhelm Röntgen").
const shortReplyWords = 5

// ReplayRenderer renders the replies of one outcome log (Text). The
// log's golden answers are the answer bank a row without reply text draws
// its wrong answer from.
type ReplayRenderer struct {
	log  *outcomes.Log
	once sync.Once
	bank map[string][]string // dataset → the first golden answer of each question, by question id
}

// NewReplayRenderer returns the renderer of log l.
func NewReplayRenderer(l *outcomes.Log) *ReplayRenderer { return &ReplayRenderer{log: l} }

// Text is the reply row gives under a render mode (RenderText or
// RenderJudgment), before it is cut to replay.max_reply_chars. In text mode
// a row with reply text gives that text. Otherwise the reply is
// "The answer is A." with A:
//
//   - judged right: the golden answer the reply states (SpokenGolden; the
//     first golden answer when it states none or there is no reply);
//   - judged wrong, with reply text: the answer the reply states
//     (StatedAnswers, the first that matches no golden answer after
//     normalisation), else the bank answer;
//   - judged wrong, no reply text: the bank answer;
//   - not judged: the reply's first stated answer, or ReplayNonAnswer when
//     it states none (a row needs a reply or a judgment).
//
// The bank answer is the first golden answer of another question of the
// row's dataset in this log, drawn by SHA-256 of (question id, model) and
// matching no golden answer of the row (neither equal to one nor holding
// one, after normalisation): a wrong answer of the same form as a right one.
// With no such answer in the log it is ReplayNonAnswer.
//
// The rule tells a policy no more about correctness than the logged replies
// do: package leakage measures it (docs/outcomes.md). One tell remains
// where a log has no reply text: a bank answer is another question's right
// answer, so a policy that remembers which answers were right on its
// training questions could learn that a remembered answer on a new question
// is wrong.
func (r *ReplayRenderer) Text(row outcomes.Row, render string) string {
	if row.Reply != nil && render == RenderText {
		return *row.Reply
	}
	reply := ""
	if row.Reply != nil {
		reply = *row.Reply
	}
	var answer string
	switch {
	case row.Correct != nil && *row.Correct:
		answer = trimAnswer(oneLine(SpokenGolden(row.Golden, reply)))
	case row.Correct == nil:
		answer = ReplayNonAnswer
		if c := StatedAnswers(reply, row.Question); len(c) > 0 {
			answer = c[0]
		}
	default:
		for _, c := range StatedAnswers(reply, row.Question) {
			if !matchesGolden(c, row.Golden) {
				answer = c
				break
			}
		}
		if answer == "" {
			answer = r.bankAnswer(row)
		}
	}
	return "The answer is " + answer + "."
}

// bankAnswer is row's wrong answer drawn from the log's golden answers (see
// Text).
func (r *ReplayRenderer) bankAnswer(row outcomes.Row) string {
	r.once.Do(r.fillBank)
	bank := r.bank[strings.ToLower(row.Dataset)]
	if len(bank) == 0 {
		return ReplayNonAnswer
	}
	sum := sha256.Sum256([]byte(row.QuestionID + "\x00" + row.Model))
	start := binary.BigEndian.Uint64(sum[:8]) % uint64(len(bank))
	for k := range uint64(len(bank)) {
		a := trimAnswer(oneLine(bank[(start+k)%uint64(len(bank))]))
		if !overlapsGolden(a, row.Golden) {
			return a
		}
	}
	return ReplayNonAnswer
}

func (r *ReplayRenderer) fillBank() {
	r.bank = map[string][]string{}
	if r.log == nil {
		return
	}
	type entry struct{ id, answer string }
	byDataset := map[string][]entry{}
	seen := map[string]bool{}
	for _, row := range r.log.Rows {
		if seen[row.QuestionID] {
			continue
		}
		seen[row.QuestionID] = true
		if a := firstGolden(&Question{Golden: row.Golden}); a != "" {
			ds := strings.ToLower(row.Dataset)
			byDataset[ds] = append(byDataset[ds], entry{row.QuestionID, a})
		}
	}
	for ds, es := range byDataset {
		slices.SortFunc(es, func(a, b entry) int { return strings.Compare(a.id, b.id) })
		for _, e := range es {
			r.bank[ds] = append(r.bank[ds], e.answer)
		}
	}
}

// matchesGolden reports whether a normalises to one of the golden answers
// (what exact match would score right).
func matchesGolden(a string, golden []string) bool {
	return data.ExactMatch(a, golden) == 1
}

// overlapsGolden reports whether a, normalised, equals, holds or is held by
// a golden answer's normalised words.
func overlapsGolden(a string, golden []string) bool {
	na := " " + data.Normalize(a) + " "
	if strings.TrimSpace(na) == "" {
		return true
	}
	for _, g := range golden {
		ng := data.Normalize(g)
		if ng == "" {
			continue
		}
		if strings.Contains(na, " "+ng+" ") || strings.Contains(" "+ng+" ", na) {
			return true
		}
	}
	return false
}

// StatedAnswers are the short answers a reply states, best first, by this
// rule (the reply's whitespace collapsed first):
//
//  1. A reply of at most 5 words and no "is", "are", "was" or "were" is
//     its own answer, stripped of surrounding quotes and brackets and of
//     final punctuation.
//  2. Otherwise the reply is split into sentences (at ".", "!" or "?"
//     followed by a space, unless the word before the period is one or two
//     letters long, such as an initial; and at line breaks). Each sentence,
//     in order, gives its candidates: first the spans in double quotes, then
//     the maximal runs of words that start with an upper-case letter or a
//     digit (joined across "of", "the", "and", "de", "la", "van", "von",
//     "for" and "&" when a capitalised word follows; a run ends after a
//     word followed by a comma, semicolon, colon or bracket, and before a
//     word in brackets; "The", "A" or "An" starting a sentence is left
//     out). When no sentence gives a candidate, the phrase after the last
//     "is", "are", "was" or "were" of each sentence, up to a comma,
//     semicolon, colon or bracket ("a jubbah").
//  3. A candidate is dropped when it has no content word (a word outside
//     the simulator's stop words and a few sentence openers such as
//     "However") or when each of its content words occurs in the question.
//     Candidates are cut to 8 words.
//
// A reply with no candidate states none (nil).
func StatedAnswers(reply, question string) []string {
	text := strings.Join(strings.Fields(strings.ToValidUTF8(reply, "\uFFFD")), " ")
	if text == "" {
		return nil
	}
	qWords := words(question)
	var out []string
	add := func(c string) {
		c = trimAnswer(c)
		if c == "" || slices.Contains(out, c) || !hasNewContent(c, qWords) {
			return
		}
		if w := strings.Fields(c); len(w) > maxStatedWords {
			c = trimAnswer(strings.Join(w[:maxStatedWords], " "))
		}
		out = append(out, c)
	}
	if ws := strings.Fields(text); len(ws) <= shortReplyWords && !slices.ContainsFunc(ws, func(w string) bool { return copulas[strings.ToLower(w)] }) {
		if c := trimAnswer(text); c != "" && len(words(c)) > 0 {
			return []string{c}
		}
		return nil
	}
	ss := sentences(reply)
	for _, s := range ss {
		for _, c := range quotedSpans(s) {
			add(c)
		}
		for _, c := range capitalRuns(s) {
			add(c)
		}
	}
	for _, s := range ss {
		if len(out) > 0 {
			break
		}
		add(afterCopula(s))
	}
	return out
}

// copulas end the subject of "X is Y." (StatedAnswers, step 2).
var copulas = map[string]bool{"is": true, "are": true, "was": true, "were": true}

// afterCopula is the phrase after the last copula of sentence s, up to the
// next comma, semicolon, colon or bracket ("The garment is a jubbah." →
// "a jubbah"), or "" when s has no copula.
func afterCopula(s string) string {
	ws := strings.Fields(s)
	last := -1
	for i, w := range ws {
		if copulas[strings.ToLower(w)] {
			last = i
		}
	}
	if last < 0 {
		return ""
	}
	var phrase []string
	for _, w := range ws[last+1:] {
		if strings.HasPrefix(w, "(") || strings.HasPrefix(w, "[") {
			break
		}
		phrase = append(phrase, w)
		if strings.ContainsAny(lastRuneString(w), ",;:") {
			break
		}
	}
	return strings.Join(phrase, " ")
}

// sentences splits a reply into sentences (StatedAnswers, step 2).
func sentences(reply string) []string {
	var out []string
	for _, line := range strings.Split(strings.ToValidUTF8(reply, "\uFFFD"), "\n") {
		ws := strings.Fields(line)
		start := 0
		for i, w := range ws {
			last, _ := utf8.DecodeLastRuneInString(strings.TrimRight(w, `"'”’)`))
			end := last == '!' || last == '?'
			if last == '.' {
				core := strings.TrimRight(strings.TrimRight(w, `"'”’)`), ".")
				end = utf8.RuneCountInString(core) > 2 || (core != "" && unicode.IsDigit(lastRune(core)))
			}
			if end || i == len(ws)-1 {
				if s := strings.Join(ws[start:i+1], " "); s != "" {
					out = append(out, s)
				}
				start = i + 1
			}
		}
	}
	return out
}

func lastRune(s string) rune {
	r, _ := utf8.DecodeLastRuneInString(s)
	return r
}

// quotedSpans are the spans of s between straight or curly double quotes.
func quotedSpans(s string) []string {
	var out []string
	open := -1
	for i, r := range s {
		switch {
		case open < 0 && (r == '"' || r == '“'):
			open = i + utf8.RuneLen(r)
		case open >= 0 && (r == '"' || r == '”'):
			if span := strings.TrimSpace(s[open:i]); span != "" {
				out = append(out, span)
			}
			open = -1
		}
	}
	return out
}

// articles are dropped from the start of a sentence's first run.
var articles = map[string]bool{"the": true, "a": true, "an": true}

// runJoiners join two capitalised words into one run ("Bank of England").
var runJoiners = map[string]bool{"of": true, "the": true, "and": true, "de": true, "la": true, "van": true, "von": true, "for": true, "&": true}

// capitalRuns are the maximal runs of capitalised words or numbers of s
// (StatedAnswers, step 2).
func capitalRuns(s string) []string {
	ws := strings.Fields(s)
	var out []string
	var run []string
	flush := func() {
		for len(run) > 0 && runJoiners[strings.ToLower(run[len(run)-1])] {
			run = run[:len(run)-1]
		}
		if len(run) > 0 {
			out = append(out, strings.Join(run, " "))
		}
		run = nil
	}
	for i, w := range ws {
		if strings.HasPrefix(w, "(") || strings.HasPrefix(w, "[") {
			flush() // "(BLM)" glosses the run before it
		}
		core := strings.TrimLeft(w, `"'“‘([`)
		r, _ := utf8.DecodeRuneInString(core)
		capital := unicode.IsUpper(r) || unicode.IsDigit(r)
		joiner := len(run) > 0 && runJoiners[strings.ToLower(core)] && i+1 < len(ws) && startsCapital(ws[i+1])
		if !capital && !joiner {
			flush()
			continue
		}
		if len(run) == 0 && i == 0 && articles[strings.ToLower(core)] && i+1 < len(ws) && startsCapital(ws[i+1]) {
			continue // "The" capitalised because it starts the sentence
		}
		run = append(run, strings.TrimRight(core, `,;:!?"'”’)]`))
		if strings.ContainsAny(lastRuneString(w), ",;:)]") || strings.ContainsAny(w, "(") {
			flush()
		}
	}
	flush()
	return out
}

func startsCapital(w string) bool {
	r, _ := utf8.DecodeRuneInString(strings.TrimLeft(w, `"'“‘([`))
	return unicode.IsUpper(r) || unicode.IsDigit(r)
}

func lastRuneString(w string) string {
	r, _ := utf8.DecodeLastRuneInString(w)
	return string(r)
}

// openerWords start sentences without stating anything ("However, ...").
var openerWords = map[string]bool{}

func init() {
	for _, w := range strings.Fields(`however unfortunately sorry yes according based although while during after before
		currently today generally typically usually unknown im ive dont cant as ai language model note please
		sure certainly first second third one two there hello hi bing this m ll re ve d`) {
		openerWords[w] = true
	}
}

// hasNewContent reports whether c has a content word (not a stop word or
// an opener) that the question lacks.
func hasNewContent(c string, question map[string]bool) bool {
	for w := range words(c) {
		if simStopWords[w] || openerWords[w] {
			continue
		}
		if !question[w] {
			return true
		}
	}
	return false
}

// trimAnswer strips a candidate of surrounding quotes and brackets, and of
// final punctuation.
func trimAnswer(c string) string {
	for {
		t := strings.TrimSpace(c)
		t = strings.TrimRight(t, `.,;:!?`)
		t = strings.TrimLeft(t, `"'“‘([`)
		t = strings.TrimRight(t, `"'”’)]`)
		if t == c {
			return t
		}
		c = t
	}
}

// oneLine collapses the whitespace of s.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
