// Package plot draws the training curves of a recal run, the figures behind
// `recal plot RUN_DIR`.
//
// It reads the run folder's metrics.jsonl (one JSON object per training step)
// and, when present, validation.jsonl (one object per validation), and writes
// each figure twice, as PNG (PNGWidth×PNGHeight pixels) and SVG:
//
//   - rewards: the reward components (ans, info, format, route, balance and
//     any other key of "reward") over steps;
//   - calls: pool calls per question ("calls_per_question"), the route count
//     of the ReCal paper's figure 3;
//   - model_share: each pool model's share of the calls ("model_share"), as
//     in the paper's figure 4;
//   - entropy: the policy entropy ("entropy");
//   - kl: the KL divergence to the reference policy ("kl");
//   - validation_f1: validation F1 per dataset and their average, drawn only
//     when validation.jsonl exists.
//
// The per-step figures show each series twice: faint, its value at every
// step, and bold, its trailing moving average (Options.Window, DefaultWindow
// steps unless set). A figure whose fields appear in no line is skipped with
// a warning, so a run that logs no KL still gets its other figures.
//
// Options.Ablation draws the figure of `recal ablate`: the answer reward over
// steps per variant, each line the mean over seeds of the seeds' smoothed
// curves, with a band from their minimum to their maximum.
//
// Lines may lack any field and may carry fields this package does not know;
// both are fine. A line that is not valid JSON is an error naming the file and
// line (a *LineError), except the file's last line, which a run killed while
// writing leaves truncated: it is skipped with a warning. When a resumed run
// logs a step again, the later record of that step and of every step after
// it replaces the earlier ones.
//
// The package is pure Go (gonum.org/v1/plot) and builds with CGO_ENABLED=0.
package plot
