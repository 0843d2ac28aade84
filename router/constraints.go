package router

import (
	"bytes"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// callBan is what router.call_first bans for p's next token: nil once p
// holds a reply or may call no more, else the tokens that would write
// "<a", the start of <answer> (openBan).
func (e *Scheduler) callBan(p *Pending) []int32 {
	if len(p.out.Calls) > 0 || p.callsMade >= p.maxTurns {
		return nil
	}
	return openBan(p, e.openA, e.startA)
}

// finalBan is what router.final_answer's guard bans for p's next token:
// nil while p may call, else the tokens that would write "<s", the start
// of <search> (openBan).
func (e *Scheduler) finalBan(p *Pending) []int32 {
	if p.callsMade < p.maxTurns {
		return nil
	}
	return openBan(p, e.openS, e.startS)
}

// answerBan is what router.final_answer forces for p's next token: nil
// while p may call, or until its turn has closed a <think>, or once an
// <answer> is open after it; else every token but those that go on
// spelling <answer> after the turn's last </think> (white space before it
// kept, none added).
func (e *Scheduler) answerBan(p *Pending) []int32 {
	if p.callsMade < p.maxTurns {
		return nil
	}
	at := bytes.LastIndex(p.turnText, []byte(ThinkClose))
	if at < 0 {
		return nil
	}
	rest := string(p.turnText[at+len(ThinkClose):])
	if strings.Contains(rest, AnswerOpen) {
		return nil
	}
	ban := e.banAllBut(func(id int) bool {
		b := e.tok.TokenBytes(id)
		if len(b) == 0 {
			return false
		}
		w := strings.TrimLeft(rest+string(b), " \n")
		return w != "" && (strings.HasPrefix(AnswerOpen, w) || strings.HasPrefix(w, AnswerOpen))
	})
	if len(ban) == e.dec.(VocabDecoder).Vocab() { // no token spells it: leave the turn free
		return nil
	}
	return ban
}

// openBan bans opening one tag: the tokens open that hold "<" and the
// tag's first letter, and after a lone "<" also those, start, that begin
// with the letter. nil when that is no token of the vocabulary.
func openBan(p *Pending, open, start []int32) []int32 {
	text := p.turnText
	if i := bytes.LastIndexByte(text, '>'); i >= 0 {
		text = text[i+1:]
	}
	if len(text) > 0 && text[len(text)-1] == '<' {
		return append(slices.Clone(start), open...)
	}
	if len(open) == 0 {
		return nil
	}
	return slices.Clip(open) // appended to (router.match_close): never into open
}

// closeBan is what router.match_close bans for p's next token: nil when
// no tag is open at the end of p's turn, else the tokens that would write
// a closing tag other than the open tag's own (what follows a "</" must
// spell the rest of it). Only tokens that hold "</" can do so, and after a
// lone "<" those that start with "/"; inside an unfinished "</…" any token
// can (the whole vocabulary is checked, a step or two per closing tag).
func (e *Scheduler) closeBan(p *Pending) []int32 {
	_, want := e.closing(p.turnText)
	if want == "" {
		return nil
	}
	tail := ""
	if i := bytes.LastIndexByte(p.turnText, '<'); i >= 0 && bytes.IndexByte(p.turnText[i:], '>') < 0 {
		tail = string(p.turnText[i:])
	}
	bad := func(id int32) bool {
		w := tail + string(e.tok.TokenBytes(int(id)))
		for off := 0; ; {
			i := strings.Index(w[off:], "</")
			if i < 0 {
				return false
			}
			c := w[off+i:]
			if !strings.HasPrefix(want, c) && !strings.HasPrefix(c, want) {
				return true
			}
			off += i + len(want)
			if off >= len(w) {
				return false
			}
		}
	}
	var ban []int32
	if strings.HasPrefix(tail, "</") {
		for id := range e.dec.(VocabDecoder).Vocab() {
			if bad(int32(id)) {
				ban = append(ban, int32(id))
			}
		}
		return ban
	}
	cands := e.closers
	if tail == "<" {
		cands = append(slices.Clone(e.slashes), e.closers...)
	}
	for _, id := range cands {
		if bad(id) {
			ban = append(ban, id)
		}
	}
	return ban
}

// spanBan is what router.answer_span bans for p's next token: nil when
// p's turn has no <answer> open or p was shown no reply, else every token
// but those that keep the answer written so far a span of a reply's text
// starting at a word's start (after at most one leading space) and, once
// the answer is such a span of whole words, those that start the closing
// tag (an answer does not stop inside a word: "Mer" of "Mercedes-Benz").
// Once anything but a span is written (the closing tag), the turn goes on
// free. With router.answer_whole a reply's short answer (p.answers) is a
// span only from its start, and closes only when written whole.
func (e *Scheduler) spanBan(p *Pending) []int32 {
	if len(p.replies) == 0 && len(p.answers) == 0 {
		return nil
	}
	at := bytes.LastIndex(p.turnText, []byte(AnswerOpen))
	if at < 0 {
		return nil
	}
	written := p.turnText[at+len(AnswerOpen):]
	if bytes.IndexByte(written, '<') >= 0 {
		return nil
	}
	if p.spanToks == nil {
		sources := slices.Concat(p.replies, p.answers)
		for id := range e.dec.(VocabDecoder).Vocab() {
			b := string(e.tok.TokenBytes(id))
			if b == "" {
				continue
			}
			ok := strings.HasPrefix(AnswerClose, b) || b == " "
			for _, r := range sources {
				ok = ok || strings.Contains(r, strings.TrimPrefix(b, " "))
			}
			if ok {
				p.spanToks = append(p.spanToks, int32(id))
			}
		}
	}
	word := strings.TrimPrefix(string(written), " ")
	inReply := func(span string, whole bool) bool {
		for _, r := range p.replies {
			if wordSpan(r, span, whole) {
				return true
			}
		}
		for _, a := range p.answers {
			if (whole && a == span) || (!whole && strings.HasPrefix(a, span)) {
				return true
			}
		}
		return false
	}
	closes := word != "" && inReply(word, true)
	allowed := map[int32]bool{}
	for _, id := range p.spanToks {
		b := string(e.tok.TokenBytes(int(id)))
		var ok bool
		switch {
		case strings.HasPrefix(AnswerClose, b):
			ok = closes
		case len(written) == 0 && b == " ":
			ok = true
		default:
			cand := word + b
			if word == "" && len(written) == 0 {
				cand = strings.TrimPrefix(b, " ")
			}
			ok = cand != "" && inReply(cand, false)
		}
		if ok {
			allowed[id] = true
		}
	}
	if len(allowed) == 0 { // replies of no text: nothing to copy
		return nil
	}
	return e.banAllBut(func(id int) bool { return allowed[int32(id)] })
}

// banAllBut is every id of the decoder's vocabulary that keep rejects.
func (e *Scheduler) banAllBut(keep func(id int) bool) []int32 {
	var ban []int32
	for id := range e.dec.(VocabDecoder).Vocab() {
		if !keep(id) {
			ban = append(ban, int32(id))
		}
	}
	return ban
}

// nameBan is what router.search_names bans for p's next token: nil unless
// p's turn has a <search> open with no colon yet, else every token but
// those that keep what follows the tag (after at most one leading space) a
// prefix of "NAME:" for a model NAME p may call, or that complete it.
func (e *Scheduler) nameBan(p *Pending) []int32 {
	at := bytes.LastIndex(p.turnText, []byte(SearchOpen))
	if at < 0 {
		return nil
	}
	written := string(p.turnText[at+len(SearchOpen):])
	if strings.ContainsAny(written, ":<") {
		return nil
	}
	var targets []string
	for _, n := range e.names {
		if info, ok := e.pool.Lookup(n); ok && (p.allowed == nil || p.allowed[info.Name]) {
			targets = append(targets, n+":")
		}
	}
	if len(targets) == 0 {
		return nil
	}
	return e.banAllBut(func(id int) bool {
		b := string(e.tok.TokenBytes(id))
		cand := strings.TrimPrefix(written+b, " ")
		ok := len(b) > 0 && (cand == "" && written == "")
		for _, t := range targets {
			ok = ok || (cand != "" && (strings.HasPrefix(t, cand) || strings.HasPrefix(cand, t)))
		}
		return ok
	})
}

// wordSpan reports whether span occurs in text starting at a word's start
// (text's start, or after a rune that is neither a letter nor a digit) and,
// when whole, also ending where no letter or digit follows ("thirty-" of
// "thirty-three" does not).
func wordSpan(text, span string, whole bool) bool {
	word := func(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }
	for off := 0; ; {
		i := strings.Index(text[off:], span)
		if i < 0 {
			return false
		}
		i += off
		before, _ := utf8.DecodeLastRuneInString(text[:i])
		after, _ := utf8.DecodeRuneInString(text[i+len(span):])
		first, _ := utf8.DecodeRuneInString(span)
		end := i + len(span)
		// A span starts at a character's first byte, and a whole one ends
		// at a character's end: half of "ā" is no answer.
		if (i == len(text) || utf8.RuneStart(text[i])) && (i == 0 || !word(before) || !word(first)) &&
			(!whole || end == len(text) || (utf8.RuneStart(text[end]) && !word(after))) {
			return true
		}
		_, n := utf8.DecodeRuneInString(text[i:])
		off = i + n
	}
}

// closing is the closing tag of the tag open at the end of a turn's text
// (<think>, <search> or <answer>), as tokens and text; nil when none is open.
func (e *Scheduler) closing(turn []byte) ([]int32, string) {
	at, closeTag := -1, ""
	for _, tag := range [][2]string{{ThinkOpen, ThinkClose}, {SearchOpen, SearchClose}, {AnswerOpen, AnswerClose}} {
		i := bytes.LastIndex(turn, []byte(tag[0]))
		if i > at && bytes.LastIndex(turn, []byte(tag[1])) < i {
			at, closeTag = i, tag[1]
		}
	}
	if at < 0 {
		return nil, ""
	}
	return e.closeToks[closeTag], closeTag
}

// guardSlack bounds, in nats, how far a guard's ban (router.call_first,
// router.final_answer, router.match_close) may have moved a chosen token's
// log-probability for the token still to count as unconstrained
// (Sample.Constrained): a ban of
// mass m moves it by −log(1−m), and m ≤ 1 − p for a chosen token of
// probability p, so a token chosen with −log p ≤ guardSlack moved by at
// most that. The guards are on inside nearly every tag (Qwen's added
// tokens such as </tool_call> are always banned there), so listing every
// token under them took PPO's KL penalty off nearly every token, and
// Router-R1's PPO collapsed on the EVOUNA world with match_close on. A
// span constraint (answer_span, search_names) forces its tokens: they are
// always listed. A token's log-probability is the unconstrained policy's
// (0 when the decoder computes none, as evaluation's does: no token is
// listed then, and only training reads the list).
const guardSlack = 0.1

// RepeatBan returns the tokens that would complete an n-gram already in
// turn (the tokens of the current turn so far): for every earlier position
// where turn's last n−1 tokens occur, the token that followed them. nil when
// n < 2 or the turn is shorter than n.
func RepeatBan(turn []int32, n int) []int32 {
	if n < 2 || len(turn) < n {
		return nil
	}
	k := n - 1
	tail := turn[len(turn)-k:]
	var ban []int32
	for i := 0; i+k < len(turn); i++ {
		match := true
		for j := 0; j < k; j++ {
			if turn[i+j] != tail[j] {
				match = false
				break
			}
		}
		if match && !containsToken(ban, turn[i+k]) {
			ban = append(ban, turn[i+k])
		}
	}
	return ban
}

func containsToken(ts []int32, t int32) bool {
	for _, u := range ts {
		if u == t {
			return true
		}
	}
	return false
}
