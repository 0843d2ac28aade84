package llmpool

import "fmt"

// quoter is implemented by providers that can say, without calling, what
// asking the model a question costs. Without it, Pool.DearestCall prices
// the question's tokens in and DefaultOpenAIMaxTokens out.
type quoter interface {
	// quote returns the completion a call about q would be charged for
	// (its token counts, or its logged cost); false when it cannot say.
	quote(q *Question) (completion, bool)
}

// DearestCall is the list price, USD, of the dearest single call the pool
// could make about q: the most, over the pool's models, of what asking the
// model q itself costs (Response.Cost of such a call). The router's cost
// reward measures a response's spend against it (router.CostReward). Per
// provider:
//
//   - replay: exact, the cost a call about q is charged (the logged row's
//     cost, or its tokens at the model's prices), whatever the sub-query;
//   - sim: its reply's price with the question as the sub-query and the
//     golden answer as the reply (sim.tokens_in and sim.tokens_out when set);
//   - openai: a bound, the question's estimated tokens in and the most the
//     model may reply (openai.max_tokens) out.
//
// Token counts are estimated as elsewhere in the pool (4 characters a
// token, plus the chat template's overhead). 0 when every price is 0.
func (p *Pool) DearestCall(q *Question) float64 {
	var most float64
	for _, m := range p.models {
		c, ok := completion{}, false
		if qt, is := m.prov.(quoter); is {
			c, ok = qt.quote(q)
		}
		if !ok {
			c = completion{InputTokens: questionTokens(q), OutputTokens: DefaultOpenAIMaxTokens}
		}
		price := cost(m.info, c.InputTokens, c.OutputTokens)
		if c.Cost != nil {
			price = *c.Cost
		}
		most = max(most, price)
	}
	return most
}

// questionTokens estimates the input tokens of asking q's text alone.
func questionTokens(q *Question) int {
	if q == nil {
		return chatOverheadTokens
	}
	return estimateTokens(q.Text) + chatOverheadTokens
}

func (s *sim) quote(q *Question) (completion, bool) {
	c := completion{InputTokens: s.cfg.TokensIn, OutputTokens: s.cfg.TokensOut}
	if c.InputTokens == 0 {
		c.InputTokens = questionTokens(q)
	}
	if c.OutputTokens == 0 {
		c.OutputTokens = estimateTokens(fmt.Sprintf("[simulated %s] The answer is %s.", s.name, firstGolden(q)))
	}
	return c, true
}

func (o *openAI) quote(q *Question) (completion, bool) {
	return completion{InputTokens: questionTokens(q), OutputTokens: o.cfg.MaxTokens}, true
}
