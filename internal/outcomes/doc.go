// Package outcomes is recal's outcome log: logged answers of real models to
// QA questions, one JSON Lines row per (question, model), from which the
// llmpool provider "replay" answers pool calls offline, deterministically and
// at no API cost, so that routers are trained and compared on real
// behaviour.
//
// A row (Row) carries the dataset, the question id as package data gives it
// ("<dataset>/<source id>"), the question text, its golden answers, the
// model, and optionally the reply text, a correctness judgment (and who
// judged it), the prompt and completion tokens and the cost in USD. Read is
// strict: unknown fields, wrong types, missing required fields, a key given
// twice and a second row of one (question, model) are errors naming the file
// and line.
//
// ConvertEVOUNA turns EVOUNA (Wang et al., "Evaluating Open-QA Evaluation",
// arXiv:2305.12421: human judgments of five QA systems on NQ-open and
// TriviaQA) into a log plus the question files package data reads. The
// outcome matrix of `recal collect` converts with baselines.ExportLog.
// docs/outcomes.md describes the format field by field.
package outcomes
