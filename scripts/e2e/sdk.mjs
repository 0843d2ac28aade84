// Drives a running `recal serve` with the official OpenAI SDK (the `openai`
// npm package), as any client would: lists the models, asks a plain
// question, a streamed one with include_usage, one restricted to a pool
// model with recal.models, and one the server must refuse. It checks what
// the SDK parsed and prints a JSON summary on stdout; any failed check
// exits 1 with the reason on stderr.
//
//   RECAL_URL=http://127.0.0.1:8080/v1 [RECAL_API_KEY=...] [RECAL_QUESTION=...] node scripts/e2e/sdk.mjs
//
// cmd/recal's TestServeOpenAISDK runs it against a real `recal serve`
// (`make e2e-serve`).
import OpenAI from "openai";

const baseURL = process.env.RECAL_URL ?? "http://127.0.0.1:8080/v1";
const question = process.env.RECAL_QUESTION ?? "Who wrote the novel Dracula?";
const client = new OpenAI({ baseURL, apiKey: process.env.RECAL_API_KEY ?? "unused", maxRetries: 0, timeout: 120_000 });

function check(ok, what, got) {
  if (!ok) {
    console.error(`sdk.mjs: ${what}; got ${JSON.stringify(got)}`);
    process.exit(1);
  }
}

function checkTrace(trace, allowed, what) {
  check(Array.isArray(trace), `${what}: recal.trace is an array`, trace);
  trace.forEach((e, i) => {
    check(Number.isInteger(e.turn) && typeof e.model === "string" && typeof e.sub_query === "string" &&
      typeof e.latency_ms === "number" && typeof e.cost_usd === "number" && typeof e.cached === "boolean" &&
      typeof e.failed === "boolean" && Number.isInteger(e.prompt_tokens) && Number.isInteger(e.completion_tokens),
      `${what}: trace entry ${i} has turn, model, sub_query, latency_ms, tokens, cost_usd, cached, failed`, e);
    if (allowed && !e.failed) {
      check(allowed.includes(e.model), `${what}: trace entry ${i} calls only ${allowed}`, e);
    }
  });
}

function checkUsage(u, what) {
  check(u && Number.isInteger(u.prompt_tokens) && Number.isInteger(u.completion_tokens) &&
    u.total_tokens === u.prompt_tokens + u.completion_tokens && u.prompt_tokens > 0,
    `${what}: usage has prompt, completion and total tokens`, u);
}

const summary = {};

// GET /v1/models: the router first, then the pool models it may call.
const models = [];
for await (const m of client.models.list()) {
  models.push(m);
}
check(models.length >= 2 && models[0].recal?.role === "router", "models.list(): the router, then pool models", models);
const router = models[0].id;
const pool = models.slice(1).map((m) => m.id);
check(models.slice(1).every((m) => m.recal?.role === "pool" && typeof m.recal?.price_in_usd_per_mtok === "number"),
  "models.list(): pool models with prices", models);
summary.router = router;
summary.pool = pool;

// A plain request; .withResponse() gives the headers as well.
{
  const { data: c, response } = await client.chat.completions
    .create({ model: router, messages: [{ role: "user", content: question }], temperature: 0 })
    .withResponse();
  check(c.object === "chat.completion" && c.id.startsWith("chatcmpl-") && c.model === router, "plain: a chat.completion from the router", c);
  check(c.choices.length === 1 && c.choices[0].message.role === "assistant" && typeof c.choices[0].message.content === "string",
    "plain: one assistant message", c.choices);
  check(["stop", "length"].includes(c.choices[0].finish_reason), "plain: finish_reason stop or length", c.choices[0]);
  checkUsage(c.usage, "plain");
  checkTrace(c.recal?.trace, null, "plain");
  const cost = response.headers.get("x-recal-cost-usd");
  check(cost !== null && Math.abs(Number(cost) - c.recal.total_cost_usd) < 1e-9, "plain: X-Recal-Cost-USD is recal.total_cost_usd", cost);
  check(response.headers.get("x-recal-models") !== null && response.headers.get("x-request-id"), "plain: X-Recal-Models and X-Request-Id headers", [...response.headers]);
  summary.plain = { answer: c.choices[0].message.content, finish_reason: c.choices[0].finish_reason, usage: c.usage,
    trace: c.recal.trace, end: c.recal.end, models_header: response.headers.get("x-recal-models"), cost_header: cost };
}

// A streamed request with include_usage: turn chunks (trace, empty delta),
// the answer, the finish reason, the usage chunk.
{
  const stream = await client.chat.completions.create({
    model: router, messages: [{ role: "user", content: question }], temperature: 0,
    stream: true, stream_options: { include_usage: true },
  });
  let content = "";
  let role = null;
  let finish = null;
  let usage = null;
  let chunks = 0;
  const trace = [];
  for await (const chunk of stream) {
    chunks++;
    check(chunk.object === "chat.completion.chunk", "stream: chat.completion.chunk objects", chunk);
    check(usage === null, "stream: nothing after the usage chunk", chunk);
    if (chunk.recal?.trace) {
      check(content === "" && role === null, "stream: turn chunks come before the answer", chunk);
      trace.push(...chunk.recal.trace);
    }
    if (chunk.usage) {
      check(chunk.choices.length === 0, "stream: the usage chunk has choices []", chunk);
      usage = chunk.usage;
      continue;
    }
    const d = chunk.choices[0].delta;
    if (d.role) {
      check(role === null, "stream: one role delta", chunk);
      role = d.role;
    }
    if (d.content) {
      check(role === "assistant", "stream: the first content delta has role assistant", chunk);
      content += d.content;
    }
    if (chunk.choices[0].finish_reason) {
      finish = chunk.choices[0].finish_reason;
    }
  }
  check(role === "assistant" && finish !== null, "stream: role assistant and a finish_reason", { role, finish });
  checkUsage(usage, "stream");
  checkTrace(trace, null, "stream");
  check(content === summary.plain.answer, "stream: at temperature 0 the same answer as the plain request", content);
  summary.stream = { answer: content, finish_reason: finish, usage, trace, chunks };
}

// The SDK's stream helper accumulates the chunks into a completion.
{
  const runner = client.chat.completions.stream({ model: router, messages: [{ role: "user", content: question }], temperature: 0 });
  const c = await runner.finalChatCompletion();
  check(c.choices[0].message.role === "assistant" && (c.choices[0].message.content ?? "") === summary.plain.answer,
    "stream(): finalChatCompletion() holds the answer", c);
}

// Restricted to one pool model.
{
  const only = pool[pool.length - 1];
  const c = await client.chat.completions.create({
    model: router, messages: [{ role: "user", content: [{ type: "text", text: question }] }], temperature: 0,
    recal: { models: [only], max_turns: 1 },
  });
  checkTrace(c.recal?.trace, [only], "restricted");
  check(c.recal.trace.length <= 1, "restricted: max_turns 1 allows one call", c.recal.trace);
  summary.restricted = { model: only, answer: c.choices[0].message.content, trace: c.recal.trace };
}

// A pool model that does not exist: the SDK raises a BadRequestError.
try {
  await client.chat.completions.create({ model: router, messages: [{ role: "user", content: question }], recal: { models: ["no-such-model"] } });
  check(false, "unknown model: a 400", "a completion");
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === "recal.models" && /no-such-model/.test(e.message),
    "unknown model: BadRequestError 400 naming it", { name: e.constructor.name, status: e.status, message: e.message });
  summary.unknown_model = { status: e.status, message: e.message };
}

console.log(JSON.stringify(summary));
