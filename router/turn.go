package router

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/generate"
	"github.com/recal-project/recal/llmpool"
)

// BudgetText is the observation for a <search> made after the response's
// cost budget is spent.
const BudgetText = "[router: the cost budget is spent; no model was called: answer now]"

// extend runs one decode step for ps and advances their state machines.
func (e *Scheduler) extend(ctx context.Context, ps []*Pending, s generate.Sampling, seed uint64) error {
	if len(ps) == 0 {
		return nil
	}
	rows := make([]int, len(ps))
	toks := make([][]int32, len(ps))
	for k, p := range ps {
		rows[k], toks[k] = p.row, p.feed
	}
	t0 := time.Now()
	var next []int32
	var logp []float32
	var err error
	// span: what an answer span, a model name or router.final_answer's
	// <answer> allows (every other token banned: no room for a loop);
	// guard: the few tokens router.call_first, router.final_answer and
	// router.match_close ban, which leave the n-gram rule its work.
	var ban, span, guard [][]int32
	if e.cfg.constrains() {
		span = make([][]int32, len(ps))
		guard = make([][]int32, len(ps))
		for k, p := range ps {
			if e.cfg.AnswerSpan {
				span[k] = e.spanBan(p)
			}
			if span[k] == nil && e.cfg.SearchNames {
				span[k] = e.nameBan(p)
			}
			if span[k] == nil && e.cfg.FinalAnswer {
				span[k] = e.answerBan(p)
			}
			if e.cfg.CallFirst {
				guard[k] = e.callBan(p)
			}
			if guard[k] == nil && e.cfg.FinalAnswer { // callBan's and finalBan's turns never meet
				guard[k] = e.finalBan(p)
			}
			if e.cfg.MatchClose {
				guard[k] = append(guard[k], e.closeBan(p)...)
			}
			if len(guard[k]) == 0 {
				guard[k] = nil
			}
		}
	}
	if n := e.cfg.NoRepeatNGram; n > 0 {
		// A row's next token is chosen after its feed: the turn's tokens so
		// far are the last turnToks of its output (a fed <information>
		// block starts a new turn, turnToks 0). Only the text after the
		// turn's last tag counts (the tokens after its last '>'): the
		// protocol's tags repeat themselves ("<think>" … "</think>").
		ban = make([][]int32, len(ps))
		for k, p := range ps {
			turn := p.out.Tokens[len(p.out.Tokens)-p.turnToks:]
			for i := len(turn) - 1; i >= 0; i-- {
				if bytes.IndexByte(e.tok.TokenBytes(int(turn[i])), '>') >= 0 {
					turn = turn[i+1:]
					break
				}
			}
			ban[k] = RepeatBan(turn, n)
		}
	}
	closeLoops := ban != nil && !e.cfg.bans()
	// What the decoder bans per row: a protocol constraint's (an answer
	// span or a model name, which leave no room for a loop), else the
	// n-gram rule's bans unless it closes loops instead; and the guards'.
	send := ban
	if closeLoops {
		send = nil
	}
	for k := range span {
		if span[k] == nil && guard[k] == nil {
			continue
		}
		if send == nil {
			send = make([][]int32, len(ps))
		}
		switch {
		case span[k] != nil:
			send[k] = append(slices.Clip(span[k]), guard[k]...)
		default:
			send[k] = append(slices.Clip(send[k]), guard[k]...)
		}
	}
	if send != nil {
		next, logp, err = e.dec.(BanDecoder).ExtendBanned(ctx, rows, toks, s, seed, send)
	} else {
		next, logp, err = e.dec.Extend(ctx, rows, toks, s, seed)
	}
	took := time.Since(t0)
	e.mu.Lock()
	e.stats.Decode += took
	e.mu.Unlock()
	if err != nil {
		return err
	}
	stops := []string{SearchClose, AnswerClose, InfoOpen}
	for k, p := range ps {
		o := &p.out
		p.feed = nil
		t := next[k]
		// router.on_repeat = "close": a token that would repeat an n-gram
		// of the open tag is dropped and the environment closes the tag;
		// a loop outside every tag ends the turn.
		looped := closeLoops && (span == nil || span[k] == nil) && containsToken(ban[k], t)
		fed := []int32{t}
		before := len(p.turnText)
		var closing []int32
		var closeTag string
		if looped {
			closing, closeTag = e.closing(p.turnText)
		}
		if closing != nil {
			o.Tokens = append(o.Tokens, closing...)
			o.Mask = append(o.Mask, make([]float32, len(closing))...)
			o.Logp = append(o.Logp, make([]float32, len(closing))...)
			o.Closed++
			p.turnToks += len(closing)
			p.turnText = append(p.turnText, closeTag...)
			// its own copy: fold appends the reply block to the feed
			fed, looped = slices.Clone(closing), false // after </think> the turn goes on
		} else {
			if span != nil && (span[k] != nil || (guard[k] != nil && -logp[k] > guardSlack)) {
				o.Constrained = append(o.Constrained, len(o.Tokens))
			}
			o.Tokens = append(o.Tokens, t)
			o.Mask = append(o.Mask, 1)
			o.Logp = append(o.Logp, logp[k])
			p.turnToks++
			p.policyToks++
			if isIn(t, e.opt.EOS) {
				o.End = "eos"
				o.Turns++
				e.finish(p, nil)
				continue
			}
			p.turnText = append(p.turnText, e.tok.TokenBytes(int(t))...)
		}
		capped := p.opt.MaxTokens > 0 && p.policyToks >= p.opt.MaxTokens
		_, stopped := stopIn(p.turnText, before, stops)
		if !stopped && !capped && !looped && p.turnToks < e.cfg.TurnTokens {
			p.feed = fed
			continue
		}
		// The turn is over: act on its first complete action.
		o.Turns++
		text := string(p.turnText)
		a := ParseAction(text)
		p.turnText, p.turnToks = nil, 0
		switch {
		case strings.Contains(text, InfoOpen):
			o.End = "information"
		case a.Kind == Answer:
			o.End = "answer"
		case capped:
			o.End = "length"
		case a.Kind == Search && p.callsMade >= p.maxTurns:
			o.End = "final"
		case a.Kind == Search:
			// The turn's last token goes into the cache with the reply's
			// block: the response the policy is trained on holds it.
			p.feed = fed
			e.call(p, a)
			continue
		default:
			o.End = "length"
		}
		e.finish(p, nil)
	}
	return nil
}

// call starts the pool call of a <search> turn on its own goroutine.
func (e *Scheduler) call(p *Pending, a Action) {
	turn := p.callsMade
	p.callsMade++
	p.waiting = true
	e.pending++
	cctx, cancel := context.WithCancel(p.ctx)
	p.cancelCall = cancel
	q := p.job.Question
	refuse := p.opt.MaxCostUSD > 0 && p.spent >= p.opt.MaxCostUSD
	var earlier []Call // router.agreement's: the calls before this one (the decode loop owns p.out)
	if e.cfg.Agreement {
		earlier = slices.Clone(p.out.Calls)
	}
	go func() {
		var c Call
		if refuse {
			c = Call{Model: a.Model, Query: a.Query, Turn: turn, Failed: true, Refused: true,
				Reply: BudgetText}
			if info, ok := e.pool.Lookup(a.Model); ok && (p.allowed == nil || p.allowed[info.Name]) {
				c.Model = info.Name
			}
		} else {
			c = callPool(cctx, e.pool, a, &q, turn, p.allowed)
		}
		// The reply is cut and encoded here, off the decode loop, so a
		// long one delays only its own row.
		block, body := InfoBlockNote(e.tok, c, earlier, e.cfg.InfoTokens)
		c.Reply, c.ReplyBytes = body, len(c.Reply)
		if p.opt.OnCall != nil && p.ctx.Err() == nil {
			p.opt.OnCall(c)
		}
		e.replies <- reply{p, c, block}
	}()
}

// fold applies an arrived pool reply to its response.
func (e *Scheduler) fold(rp reply) {
	p, o := rp.p, &rp.p.out
	p.waiting = false
	p.cancelCall()
	e.pending--
	e.mu.Lock()
	if c := rp.call; !c.Unknown && !c.Refused {
		e.stats.Calls++
		e.slowest[c.Turn] = max(e.slowest[c.Turn], c.Latency)
	}
	e.mu.Unlock()
	if err := p.ctx.Err(); err != nil {
		e.finish(p, err)
		return
	}
	p.spent += rp.call.Cost
	// A budget refusal is no reply: its notice is not a span to answer from.
	if e.cfg.AnswerSpan && !rp.call.Refused {
		if a, ok := data.ShortAnswer(rp.call.Reply); e.cfg.AnswerWhole && ok {
			p.answers = append(p.answers, a)
		} else {
			p.replies = append(p.replies, rp.call.Reply)
		}
		p.spanToks = nil // made again, with this reply, when an answer needs them
	}
	o.Calls = append(o.Calls, rp.call)
	o.Tokens = append(o.Tokens, rp.block...)
	o.Mask = append(o.Mask, make([]float32, len(rp.block))...)
	o.Logp = append(o.Logp, make([]float32, len(rp.block))...)
	p.feed = append(p.feed, rp.block...)
}

// callPool makes one call for a <search> action. A name that is no pool
// model, or no model of allowed (when not nil), gets a failure observation
// and no call.
func callPool(ctx context.Context, pool Pool, a Action, q *llmpool.Question, turn int, allowed map[string]bool) Call {
	info, ok := pool.Lookup(a.Model)
	if !ok || (allowed != nil && !allowed[info.Name]) {
		return Call{Model: a.Model, Query: a.Query, Turn: turn, Failed: true, Unknown: true,
			Reply: fmt.Sprintf(UnknownModelText, truncate(a.Model, 64), "see the model list in the prompt")}
	}
	resp := pool.Call(ctx, llmpool.Request{Model: info.Name, Query: a.Query, Question: q})
	return Call{Model: info.Name, Query: a.Query, Reply: resp.Text, Evidence: resp.Evidence, Failed: resp.Failed, Cached: resp.Cached,
		Cost: resp.Cost, Latency: resp.Latency, Turn: turn,
		PromptTokens: resp.InputTokens, CompletionTokens: resp.OutputTokens, TokensEstimated: resp.TokensEstimated}
}

// ReplyBytesPerToken bounds how much of a pool reply is read: InfoBlock cuts
// a reply to limit × ReplyBytesPerToken bytes (at a UTF-8 boundary) before
// anything else, so a reply of megabytes costs what a short one costs. Text
// averages about 4 bytes a token and few tokens are longer than 16 bytes
// (Qwen2.5: 1.3% of the vocabulary, runs of spaces, dashes or code), so the
// cut almost never reaches the tokens the policy is shown; when it does,
// the block just holds fewer tokens.
const ReplyBytesPerToken = 16

// InfoBlock is the observation appended after a pool call,
// "\n\n<information>BODY</information>\n\n", and BODY as text (what
// Call.Reply records). BODY is the reply cut to limit × ReplyBytesPerToken
// bytes, sanitised (protocol tags removed), encoded as plain text
// (EncodePlain: "<|im_end|>" in a reply is text, not a control token) and
// cut to at most limit tokens. Only the wrapping is recal's own.
func InfoBlock(tok Tokenizer, reply string, limit int) (block []int32, body string) {
	return InfoBlockNote(tok, Call{Reply: reply}, nil, limit)
}

// InfoBlockNote is InfoBlock of c.Reply with router.agreement's note on c
// (AgreementNote against earlier, the response's earlier calls as shown)
// after BODY, inside the block; BODY is still the reply alone. No note
// without earlier calls.
func InfoBlockNote(tok Tokenizer, c Call, earlier []Call, limit int) (block []int32, body string) {
	reply := c.Reply
	limit = max(limit, 0)
	maxBytes := math.MaxInt
	if limit < math.MaxInt/ReplyBytesPerToken {
		maxBytes = limit * ReplyBytesPerToken
	}
	ids := tok.EncodePlain(sanitizeReply(truncate(reply, maxBytes)))
	if len(ids) > limit {
		ids = ids[:limit]
	}
	body = tok.Decode(ids)
	block = toInt32(tok.Encode("\n\n" + InfoOpen))
	block = append(block, toInt32(ids)...)
	if len(earlier) > 0 {
		c.Reply = body
		block = append(block, toInt32(tok.EncodePlain(AgreementNote(c, earlier)))...)
	}
	block = append(block, toInt32(tok.Encode(InfoClose+"\n\n"))...)
	return block, body
}

// AgreementVersion changes when Agreeing decides differently (eval's
// identity holds it when router.agreement is on, so results made under an
// earlier rule are not resumed). 2: read on what the models wrote
// (Call.Evidence), both ways, a short reply being its own answer (before:
// the shown replies, one way, "answer is" only).
const AgreementVersion = 2

// Agreeing names, in call order and each once, the models of the earlier
// calls that agree with c (data.Agree: one's short answer is mentioned by
// the other's text as a run of whole words, either way round). Both are
// read on what the models wrote
// (Call.Evidence when set, else Call.Reply), so a replayed reply rendered
// from its judgment agrees as often as the logged reply it stands for.
// Failed calls (errors, refusals) agree with nothing. It is
// router.agreement's note and the "agree" warm-up route's stopping rule.
func Agreeing(c Call, earlier []Call) []string {
	if c.Failed {
		return nil
	}
	var same []string
	for _, e := range earlier {
		if !e.Failed && !slices.Contains(same, e.Model) && data.Agree(c.Written(), e.Written()) {
			same = append(same, e.Model)
		}
	}
	return same
}

// Written is what the call's model wrote: Evidence when the reply shown is
// rendered, else the reply.
func (c Call) Written() string {
	if c.Evidence != "" {
		return c.Evidence
	}
	return c.Reply
}

// AgreementNote is router.agreement's note on c: " Agrees with: M1, M2."
// naming the Agreeing models, or " Agrees with: none.".
func AgreementNote(c Call, earlier []Call) string {
	same := Agreeing(c, earlier)
	if len(same) == 0 {
		return " Agrees with: none."
	}
	return " Agrees with: " + strings.Join(same, ", ") + "."
}

// sanitizeReply trims a pool reply and removes protocol tags from it, so an
// untrusted reply can neither close the <information> block nor fake an
// action.
func sanitizeReply(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	for changed := true; changed; { // removing one tag can join the halves of another
		changed = false
		for _, t := range []string{ThinkOpen, ThinkClose, SearchOpen, SearchClose, InfoOpen, InfoClose, AnswerOpen, AnswerClose} {
			if strings.Contains(s, t) {
				s, changed = strings.ReplaceAll(s, t, ""), true
			}
		}
	}
	return strings.TrimSpace(s)
}

func stopIn(text []byte, before int, stops []string) (string, bool) {
	for _, s := range stops {
		from := max(0, before-len(s)+1)
		if bytes.Contains(text[from:], []byte(s)) {
			return s, true
		}
	}
	return "", false
}
