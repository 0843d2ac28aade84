// Package llmpool is the pool of LLMs that the routing policy calls with
// <search>MODEL: sub-query</search> (Router-R1, ReCal).
//
// Every model of the pool is defined in config only ([pool] and
// [[pool.models]] in recal.toml): a name, the description shown to the
// policy, prices in USD per million input and output tokens, and the settings
// of its provider. Adding a model never needs code. Providers are registered
// in one place (providers in provider.go) with one constructor signature:
//
//   - "openai": any OpenAI-compatible /v1/chat/completions endpoint (NVIDIA
//     NIM, OpenRouter, vLLM), with retries, a per-provider concurrency bound
//     and a requests-per-minute limiter. Redirects are never followed: a 3xx
//     is a permanent failure whose error names the Location.
//   - "sim": a SIMULATED model for offline runs and tests. Its replies say
//     that they come from a simulator, and ModelInfo.Simulated is true.
//   - "replay": a REAL model's logged answers, read from an outcome log
//     (package outcomes, docs/outcomes.md); see "Replayed models".
//
// A response cache on disk sits in front of every provider (see cache.go).
// Its key includes the provider's endpoint (never the API key); read-only
// mode never modifies the cache directory; a reply is byte-identical whether
// it comes fresh or from the cache (invalid UTF-8 becomes U+FFFD, one per
// bad byte, either way).
//
// # Concurrency
//
// pool.max_concurrency bounds the requests on the wire across the pool; a
// model's own max_concurrency and requests_per_minute bound that model's.
// A call takes its model's slot and rate-limit token first and the
// pool-wide slot last, only around the request itself (an HTTP round trip,
// a simulated latency), and gives it back during retry backoff. A slow or
// rate-limited model therefore queues its own calls without holding up
// calls to the other models. CallBatch starts every request at once for
// the same reason.
//
// # Failure observation
//
// Pool.Call never fails its caller. When a call cannot produce a reply
// (unknown model, retries exhausted, permanent provider error, cache miss in
// read-only mode, empty query to a real model, cancelled context, closed pool)
// the Response has Failed set, Err says why, and Text is the failure text
//
//	[pool error: model NAME unavailable]
//
// (DefaultFailureText with {model} replaced by the model name, cut to 64
// characters and stripped of '<', '>' and control characters so that it
// cannot break the <information> tags). pool.failure_text overrides it; a
// "{model}" in the override is replaced the same way. The trajectory goes on
// with this text as the observation.
//
// # Simulated models
//
// Provider "sim" is a SIMULATED model: no network, no language model. Every
// reply starts with "[simulated NAME]".
//
// The rule, for a call with sub-query s about question q of dataset d:
//
//  1. Relevance r = |C(q) ∩ W(s)| / |C(q)|, where W(x) is the set of
//     lowercased words of x (maximal runs of letters and digits) and C(q) is
//     W(q.Text) minus English stop words and question words (a fixed list,
//     simStopWords in sim.go). No stemming: "founder" does not match "founded".
//     r = 1 when C(q) is empty. An empty sub-query has r = 0.
//     With sim.ignore_query = true, r = 1 whatever the sub-query.
//  2. The probability of a correct reply is p = accuracy[d] · r, with
//     accuracy[d] from sim.accuracy (dataset matched without case), else
//     sim.default_accuracy.
//  3. A uniform draw u in [0, 1) is taken from SHA-256 of (sim.seed, model
//     name, question id, dataset, sub-query); the reply is correct iff u < p.
//     The same call therefore always gets the same reply, and different
//     models draw independently.
//  4. Correct: "[simulated NAME] The answer is G." with G the first non-empty
//     golden answer. Wrong: the same sentence with a wrong answer: an answer
//     drawn from the answer bank of dataset d (WithAnswerBank) that matches
//     no golden answer of q after SQuAD normalisation (neither equal to one
//     nor containing one); without such an answer, a deterministic made-up
//     name (two invented capitalised words). Without a question (nil, or no
//     golden answer) every reply is wrong.
//  5. With probability sim.failure_rate (another draw of the same hash) the
//     call fails instead, like an unavailable provider.
//
// Token counts are sim.tokens_in and sim.tokens_out, or when 0 estimated at
// 4 characters per token from the query (plus the chat overhead) and the
// reply. The call waits sim.latency first, returning early if ctx is done.
//
// # Replayed models
//
// Provider "replay" answers a call about question q (Request.Question; its
// ID is data's "<dataset>/<source id>") with the row of (q.ID,
// replay.model) of the outcome log replay.log. No network, no language
// model, no cache (replies bypass the response cache); the same call always
// gets the same bytes, and Response.Latency is the logged latency, or 0
// (also for a failed call), never the lookup's wall time. The reply is:
//
//   - replay.render = "text" (default): the logged reply text; when the
//     row has none, the reply rendered from the judgment (below).
//   - replay.render = "judgment": the reply rendered from the judgment.
//
// Rendered (ReplayRenderer.Text): one template for every row, "The answer
// is A.", so that the form of a reply tells a policy no more about its
// judgment than the model's real reply would (package leakage measures it).
// Judged right, A is the golden answer the model's logged reply states
// (SpokenGolden: the longest golden answer whose normalised words occur in
// the normalised reply), or the first non-empty one when the reply states
// none or there is no reply. Judged wrong, A is the answer the reply states
// (StatedAnswers: a short reply itself, else quoted spans and runs of
// capitalised words of its sentences that the question does not hold; the
// first that matches no golden answer), else, and for a row without reply
// text, the first golden answer of another question of the log's dataset,
// drawn by SHA-256 of (question id, model), that matches none of the row's
// (ReplayNonAnswer, "I don't know", when the log has none). Not judged, A
// is the reply's first stated answer. In text mode a row with reply text
// gives its reply. The reply is trimmed and cut to replay.max_reply_chars
// code points (default 2048). Tokens and cost are the row's when logged;
// otherwise the input tokens are estimated from the question's text (4
// characters per token, plus the chat overhead), the output tokens from the
// logged reply text (what the model wrote, even when the reply is rendered),
// else from the rendered reply, and the cost is those tokens times the
// model's prices.
//
// What replay cannot do: the sub-query's wording does not change the
// answer, since the log holds one answer per (question, model); a question
// not in the log cannot be answered (the call fails naming it, and
// CheckReplay, which config.Load runs over [data], reports it before any
// work); an empty sub-query fails as it would for a real model. New fails
// when the log does not read or holds no row of replay.model.
//
// # Secrets
//
// An API key is read only from the environment variable named by
// openai.api_key_env, when the pool is built. It is sent only in the
// Authorization header; it is never logged, never part of an error (provider
// error bodies are redacted), never part of a cache key and never written to
// a file.
package llmpool
