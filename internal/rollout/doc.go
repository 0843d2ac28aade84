// Package rollout runs a policy: it opens a checkpoint (OpenEngine,
// ResolveCheckpoint), puts it in the routing environment (Env: the LLM pool,
// the prompt, the protocol's settings), rolls questions out, answers and
// scores them (Answer, Summarize, Score, QuestionResult) and serves queries
// (Service). It is what training, evaluation and serving share: trainer
// runs its rollouts and validation here, and eval and serve need nothing of
// the training loop. It wires router, llmpool and data to the policy
// engine in torchbridge.
package rollout
