package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/internal/docgen"
	"github.com/recal-project/recal/llmpool"
)

var updateDocs = flag.Bool("update", false, "rewrite docs/config.md, docs/cli.md and docs/outputs.md from the code (TestDocs)")

// regenerateDocs rewrites the generated reference pages (make docs runs it).
const regenerateDocs = "go test ./cmd/recal -run TestDocs -update"

// TestDocs fails when a generated reference page differs from what the
// code generates: the page would tell users about keys, defaults or flags
// the code no longer has.
func TestDocs(t *testing.T) {
	pages := []struct {
		path string
		make func() ([]byte, error)
	}{
		{"../../docs/config.md", configReference},
		{"../../docs/cli.md", func() ([]byte, error) { return docgen.CLIMarkdown(newApp(), regenerateDocs), nil }},
		{"../../docs/outputs.md", outputsReference().Markdown},
	}
	for _, p := range pages {
		t.Run(filepath.Base(p.path), func(t *testing.T) {
			got, err := p.make()
			if err != nil {
				t.Fatalf("generating %s: %v", p.path, err)
			}
			if *updateDocs {
				if err := os.WriteFile(p.path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				t.Logf("wrote %s (%d bytes)", p.path, len(got))
				return
			}
			have, err := os.ReadFile(p.path)
			if err != nil {
				t.Fatalf("%v; run `%s` to write it", err, regenerateDocs)
			}
			if !bytes.Equal(have, got) {
				line, h, w := firstDiff(have, got)
				t.Errorf("%s is stale: line %d is\n\t%q\nbut the code generates\n\t%q\nrun `%s` (or make docs) to rewrite it, and commit the result",
					p.path, line, h, w, regenerateDocs)
			}
		})
	}
}

// firstDiff returns the first line (1-based) where a and b differ, and that
// line of each ("" past the end).
func firstDiff(a, b []byte) (int, string, string) {
	la, lb := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := 0; ; i++ {
		var x, y string
		if i < len(la) {
			x = la[i]
		}
		if i < len(lb) {
			y = lb[i]
		}
		if x != y || i >= len(la) || i >= len(lb) {
			return i + 1, x, y
		}
	}
}

// configReference generates docs/config.md: every key of config.Config with
// its default, the values of recal.toml and of the paper's configuration,
// and whether a resume may change it.
func configReference() ([]byte, error) {
	offline, err := parseConfigFile("../../recal.toml")
	if err != nil {
		return nil, err
	}
	paper, err := parseConfigFile("../../configs/qwen2.5-3b-nim.toml")
	if err != nil {
		return nil, err
	}
	// What a [[pool.models]] entry gets for the keys it leaves out (config.Parse
	// fills them with Pool.SetDefaults), both provider tables present.
	entry := llmpool.Config{Models: []llmpool.ModelConfig{{OpenAI: &llmpool.OpenAIConfig{}, Sim: &llmpool.SimConfig{}}}}
	entry.SetDefaults()
	return docgen.ConfigPage{
		Root:     "../..",
		Default:  config.Default(),
		Elements: map[string]any{"pool.models": entry.Models[0]},
		Columns: []docgen.Column{
			{Label: "recal.toml", About: "the offline default that `make train` runs (a tiny policy on a CPU, a simulated pool); keys the file leaves out at their defaults.", Value: offline},
			{Label: "paper", About: "`configs/qwen2.5-3b-nim.toml`, the ReCal paper's setting (Qwen2.5-3B-Instruct on a GPU, a pool of six models on NVIDIA NIM); keys the file leaves out at their defaults.", Value: paper},
		},
		Resumable:  config.OperationalKey,
		Regenerate: regenerateDocs,
	}.Markdown()
}

// outputsReference is docs/outputs.md: every file recal writes, each JSON
// one described from the Go type encoded into it.
func outputsReference() docgen.OutputsPage {
	return docgen.OutputsPage{
		Root:       "../..",
		Regenerate: regenerateDocs,
		Notes:      outputNotes,
		Intro: "What recal writes, folder by folder: the run folder of `recal train`, the results of `recal eval` and `recal table1`, the study folder of `recal ablate`, the outcome matrix and fitted routers of `recal collect` and `recal fit`, the SFT-direct checkpoint, and `recal serve`'s trace. " +
			"JSON Lines files (`.jsonl`) hold one JSON object per line and are appended to as the work goes; JSON files are written whole, atomically (a temporary file renamed into place). " +
			"Every float is a JSON number; every key of an object of numbers is a name (a reward component, a dataset, a pool model). " +
			"How the numbers are computed is in [method.md](method.md); where the files are read back: `--resume`, `recal plot`, `calibration/testdata/reference.py check RUN_DIR`.",
		Sections: []docgen.OutputSection{
			{Title: "The run folder (recal train)", About: "`recal train --run-dir RUN_DIR` writes these; `recal ablate` writes one per variant and seed (`RUN_DIR/seed-N/<variant>/`). Only rank 0 writes, with any number of ranks. The folder is created only after the configuration, data, pool keys and policy have loaded.",
				Files: []docgen.OutputFile{
					{Path: "RUN_DIR/config.toml", About: "The resolved configuration, every key (the format of `recal.toml`, [config.md](config.md)); API keys are never in it, only the names of their environment variables. A resume never replaces it."},
					{Path: "RUN_DIR/config-STEP.toml", About: "Written by `--resume --allow-config-change`: the configuration from step STEP on."},
					{Path: "RUN_DIR/config-changes.jsonl", About: "One line per resume that changed keys (`--allow-config-change`), so that each step can be recomputed with the settings it ran with.", Pkg: "trainer", Type: "configChangeEvent"},
					{Path: "RUN_DIR/sft.jsonl", About: "One line per logged supervised warm-up step (`[sft]`).", Pkg: "trainer", Type: "SFTLine"},
					{Path: "RUN_DIR/metrics.jsonl", About: "One line per GRPO (or PPO) step: means over the step's responses. `recal plot` draws it.", Pkg: "trainer", Type: "Metrics"},
					{Path: "RUN_DIR/rollouts.jsonl", About: "One line per response of every GRPO step: its raw rewards before gating and the exact advantage the loss used (`reference.py check` recomputes them), the response and its pool calls. `recal eval`'s `knn` router learns from it.", Pkg: "trainer", Type: "rolloutLine"},
					{Path: "RUN_DIR/validation.jsonl", About: "One line per validation (every `train.validate_every` steps) on the held-out training questions.", Pkg: "internal/rollout", Type: "ValidationResult"},
					{Path: "RUN_DIR/checkpoints/step-N/", About: "A checkpoint: a Hugging Face folder (`config.json`, `model.safetensors`, `generation_config.json`, the tokenizer files) that transformers and vLLM load, plus `optimizer.safetensors` (AdamW's moments and step), `value_head.safetensors` (PPO only), `trainer_state.json` (below) and `checksums.sha256` (each other file's SHA-256, as `sha256sum` writes it; checked when the folder is loaded). Written into a hidden folder, fsynced and renamed; a write that fails removes the hidden folder. `checkpoints/sft` is the warm-up's last step; `checkpoints/last` is a symlink to the newest, switched atomically."},
					{Path: "RUN_DIR/checkpoints/step-N/trainer_state.json", About: "What `--resume` needs besides the weights: the step, the data order, the routing counts of the balance reward.", Pkg: "trainer", Type: "State"},
					{Path: "RUN_DIR/checkpoints/best.json", About: "With `train.keep_best`: the validation with the highest well-formed F1 so far; `checkpoints/best` is a symlink to its checkpoint. `recal eval --checkpoint RUN_DIR` evaluates it.", Pkg: "trainer", Type: "bestCheckpoint"},
					{Path: "RUN_DIR/.lock", About: "The `flock` that keeps a second process out of the run folder (the kernel drops it when its process ends)."},
					{Path: "RUN_DIR/plots/", About: "Written by `recal plot RUN_DIR`: the curves of `metrics.jsonl` and `validation.jsonl` as PNG and SVG."},
				}},
			{Title: "Evaluation (recal eval, recal table1)", About: "`recal eval --out DIR` (default: `eval-<split>` in the checkpoint's run folder) writes these; rerun with the same `--out`, it finishes an interrupted evaluation. `recal table1 --work DIR` writes one folder per row under `DIR/eval-<split>/` and the table beside them.",
				Files: []docgen.OutputFile{
					{Path: "DIR/results-ROUTER.jsonl", About: "One line per question a router answered. Kept only for the same inputs: results of other inputs are moved aside as `results-ROUTER.<id>.jsonl`.", Pkg: "internal/rollout", Type: "QuestionResult"},
					{Path: "DIR/results-model-MODEL.jsonl", About: "One line per question pool model MODEL answered directly (every model is asked every question): the answers the reference rows (oracle, best and cheapest single model) are computed from; kept and resumed as a router's results, with their `.id.json`. `recal table1` keeps them in `WORK/eval-SPLIT/reference`, `recal ablate` in `RUN_DIR/reference-SPLIT`.", Pkg: "internal/rollout", Type: "QuestionResult"},
					{Path: "DIR/results-ROUTER.id.json", About: "The identity of the results beside it: the digest of everything that decides the answers (the checkpoint's files, the pool, the protocol, the router's own inputs).", Pkg: "eval", Type: "identity"},
					{Path: "DIR/table.json", About: "The table, routers as rows and datasets as columns; `table.csv` and `table.md` hold the same numbers.", Pkg: "eval", Type: "Table"},
					{Path: "WORK/eval-SPLIT/table.json", About: "`recal table1`'s table, the paper's rows in the paper's groups; with `table.csv` and `table.md`.", Pkg: "eval", Type: "PaperTable"},
				}},
			{Title: "The ablation study (recal ablate)", About: "`recal ablate --run-dir RUN_DIR` trains `RUN_DIR/seed-N/warmup` and `RUN_DIR/seed-N/<variant>` (run folders as above) and writes the table beside them.",
				Files: []docgen.OutputFile{
					{Path: "RUN_DIR/ablation.json", About: "The table: per variant the mean and sample standard deviation over seeds of each column, and every seed's value. `ablation.csv` has a line per (variant, column) with every seed's value; `ablation.md` is the printed table; `ablation_reward.png` and `.svg` the answer reward per variant.", Pkg: "experiments/ablate", Type: "Table"},
				}},
			{Title: "Fitted baseline routers (recal collect, recal fit)", Files: []docgen.OutputFile{
				{Path: "OUT/outcomes.jsonl", About: "`recal collect --out OUT`: one line per (training question, pool model) asked directly.", Pkg: "eval/baselines", Type: "Outcome"},
				{Path: "OUT/pool.json", About: "The pool the outcomes come from (a folder of another pool is refused).", Pkg: "eval/baselines", Type: "PoolInfo"},
				{Path: "ROUTERS/NAME/manifest.json", About: "`recal fit --router-dir ROUTERS`: what a fitted router is, beside its `weights.safetensors` and `embedding-state.json`. The same seed writes the same bytes.", Pkg: "eval/baselines", Type: "Manifest"},
			}},
			{Title: "SFT-direct (recal train-sft-direct)", Files: []docgen.OutputFile{
				{Path: "OUT/sft-direct.json", About: "In the Hugging Face folder `recal train-sft-direct --out OUT` writes: what decides the checkpoint, so that it is reused only for the same inputs.", Pkg: "experiments/sftdirect", Type: "Spec"},
			}},
			{Title: "Serving (recal serve)", Files: []docgen.OutputFile{
				{Path: "--trace FILE", About: "One line per admitted request, with the field names of `rollouts.jsonl`'s per-response records. Questions and answers are in it (unlike the access log); API keys never are.", Pkg: "serve", Type: "RequestTrace"},
			}},
		},
	}
}

// outputNotes say what the fields of the output types mean where the code
// gives them no doc comment (docgen refuses a note for a field the code
// documents, and one for a field no file has).
var outputNotes = map[string]string{
	"trainer.configChangeEvent.From":    "the checkpoint the resume continued from (step-N)",
	"trainer.configChangeEvent.Changes": "the keys that changed",
	"config.Change.Key":                 "the dotted configuration key",
	"config.Change.Old":                 "its value before the resume",
	"config.Change.New":                 "its value from this step on",

	"trainer.SFTLine.Stage": `"sft" (the warm-up of recal train) or "sft-direct" (recal train-sft-direct)`,
	"trainer.SFTLine.Step":  "the supervised step, from 1",
	"trainer.SFTLine.Demos": "demonstrations in the step",

	"trainer.Metrics.Step":         "the GRPO step, from 1",
	"trainer.Metrics.EM":           "mean exact match of the step's answers",
	"trainer.Metrics.Advantage":    "standard deviation (population) of the step's calibrated advantages",
	"trainer.Metrics.Ratio":        "mean probability ratio π/π_old over policy tokens",
	"trainer.Metrics.Loss":         "the loss of the step's updates",
	"trainer.Metrics.StepTime":     "wall time of the step in seconds",
	"trainer.Metrics.PolicyTokens": "policy tokens in the step's responses (the loss's tokens)",
	"trainer.Metrics.PoolFailures": "pool calls of the step that failed after the pool's retries",
	"trainer.Metrics.WellFormed":   "share of well-formed responses (= reward.format)",

	"trainer.rolloutLine.Step":       "the GRPO step",
	"trainer.rolloutLine.Dataset":    "the question's dataset",
	"trainer.rolloutLine.Group":      "the question's index in the step's batch",
	"trainer.rolloutLine.Sample":     "the response's index in its group (0 to train.group_size − 1)",
	"trainer.rolloutLine.QuestionID": "the question's id, <dataset>/<source id>",
	"trainer.rolloutLine.Question":   "the question",
	"trainer.rolloutLine.Golden":     "its golden answers",
	"trainer.rolloutLine.RewardsRaw": "the raw reward components (ans, info, format, route, balance, cost) before gating",
	"trainer.rolloutLine.EM":         "exact match of the answer (logged, not a component)",
	"trainer.rolloutLine.Advantage":  "the calibrated advantage Â the loss used for every policy token of the response",
	"trainer.rolloutLine.Response":   "the whole response: the policy's text with the <information> blocks the environment inserted",
	"trainer.rolloutLine.Calls":      "the pool calls, in order",
	"trainer.rolloutLine.End":        `why the response ended: "answer", "eos", "length", "final", "context" or "information"`,
	"trainer.rolloutLine.Tokens":     "tokens the policy wrote (inserted blocks excluded)",

	"router.Call.Query":   "the sub-query the policy wrote after the model's name",
	"router.Call.Failed":  "the call failed after the pool's retries; reply holds the failure text the policy saw",
	"router.Call.Cached":  "the reply came from the pool's cache (no cost)",
	"router.Call.Cost":    "the call's cost in USD at list prices",
	"router.Call.Latency": "the call's wall time, retries included",
	"router.Call.Turn":    "the call's position among the response's calls, from 0",

	"rollout.ValidationResult.Step":     "the GRPO step after which the validation ran",
	"rollout.ValidationResult.Datasets": "the score per validation dataset",
	"rollout.Score.EM":                  "mean exact match",
	"rollout.Score.F1":                  "mean token F1",
	"rollout.Score.N":                   "questions scored",
	"rollout.Score.Calls":               "pool calls per question",
	"rollout.Score.Cost":                "the pool cost of these questions in USD: a total, not per question (n counts them)",
	"rollout.Score.WellFormed":          "share of well-formed responses",

	"trainer.State.Step":    "the last GRPO step the checkpoint includes (0 after the warm-up)",
	"trainer.State.SFTDone": "the supervised warm-up has finished",
	"trainer.State.Sampler": "the position in the training data's shuffled order",
	"trainer.State.Config":  "unused (never written by this version)",
	"trainer.State.Extra":   "unused (never written by this version)",

	"trainer.bestCheckpoint.Step":       "the step of the best validation",
	"trainer.bestCheckpoint.EM":         "its mean exact match",
	"trainer.bestCheckpoint.WellFormed": "its share of well-formed responses",

	"rollout.QuestionResult.ID":         "the question's id",
	"rollout.QuestionResult.Dataset":    "its dataset",
	"rollout.QuestionResult.Question":   "the question",
	"rollout.QuestionResult.Golden":     "its golden answers",
	"rollout.QuestionResult.Answer":     "the router's answer (the last <answer>; \"\" when none)",
	"rollout.QuestionResult.EM":         "exact match against the golden answers",
	"rollout.QuestionResult.F1":         "token F1 against the golden answers",
	"rollout.QuestionResult.WellFormed": "the response is well formed",
	"rollout.QuestionResult.Calls":      "the pool calls, in order",
	"rollout.QuestionResult.Cost":       "the calls' cost in USD",
	"rollout.QuestionResult.Response":   "the whole response, with the inserted <information> blocks",

	"eval.identity.Router":  "the router's name",
	"eval.identity.Inputs":  "each input the router's answers depend on, by name (checkpoint digest, pool, protocol, …)",
	"eval.Table.Datasets":   "the datasets, as the table's columns",
	"eval.Table.Rows":       "one row per router, in the order evaluated",
	"eval.Table.References": "the reference rows, not routers: the oracle, the best and the cheapest single pool model (docs/evaluation.md)",
	"eval.Row.Datasets":     "its score per dataset",

	"eval.PaperTable.Split":    `the test split evaluated ("all", "id", "ood")`,
	"eval.PaperTable.Datasets": "the datasets, as the table's columns",
	"eval.PaperTable.Rows":     "the paper's rows, in its order",
	"eval.PaperRow.Group":      "the paper's group of the row (no routing; heuristic and discriminative routing; RL-based routing)",
	"eval.PaperRow.Label":      "the paper's name of the row",
	"eval.PaperRow.Router":     "the registered router that made the row",
	"eval.PaperRow.Scores":     "the row's scores, as a row of table.json (absent for a row not run)",

	"ablate.Table.Datasets": "the test datasets",
	"ablate.Table.Seeds":    "the seeds the study trained",
	"ablate.Table.Std":      "which standard deviation the table's ± is",
	"ablate.Table.Rows":     "one row per variant, in the paper's order (w/o both, w/o LSC, w/o CAE, w/o DAO, ReCal)",
	"ablate.Variant.Name":   "the variant's name (recal, wo_lsc, wo_cae, wo_dao, wo_both; its run folder)",
	"ablate.Variant.Label":  "the paper's label",
	"ablate.Stat.Mean":      "the mean over seeds",
	"ablate.Stat.Std":       "the sample standard deviation over seeds (0 with one seed)",
	"ablate.Stat.N":         "the seeds averaged",
	"ablate.Row.PerSeed":    "each seed's values",
	"ablate.SeedRow.Seed":   "the seed",
	"ablate.SeedRow.Values": "exact match per column (datasets and averages) and the cost per question in USD (cost_per_q)",

	"baselines.Outcome.Dataset":       "the question's dataset",
	"baselines.Outcome.Question":      "the question",
	"baselines.Outcome.Golden":        "its golden answers",
	"baselines.Outcome.Model":         "the pool model asked",
	"baselines.Outcome.Reply":         "the model's whole reply",
	"baselines.Outcome.Cached":        "the reply came from the pool's cache",
	"baselines.PoolInfo.Version":      "the format of this file",
	"baselines.ModelInfo.Name":        "the pool model's name",
	"baselines.ModelInfo.Description": "its description in the pool",
	"baselines.ModelInfo.Provider":    `its provider ("openai", "sim")`,
	"baselines.Manifest.Router":       "the router (mlp, routellm-mf, routerdc, graphrouter)",
	"baselines.Manifest.Format":       "the format of the folder",
	"baselines.Manifest.Seed":         "the seed of the fit (recal fit --seed)",
	"baselines.RoutedModel.Name":      "the pool model's name",
	"baselines.MatrixRef.Digest":      "the outcome matrix's digest",
	"baselines.MatrixRef.Pool":        "the pool's identity (pool.json's id)",
	"baselines.MatrixRef.Questions":   "questions in the matrix",
	"baselines.MatrixRef.Datasets":    "questions per dataset",

	"sftdirect.Spec.Version":      "the version of the demonstrations (a new one refits)",
	"sftdirect.Spec.DType":        "policy.dtype",
	"sftdirect.Spec.BatchSize":    "sft.batch_size",
	"sftdirect.Spec.LR":           "sft.lr",
	"sftdirect.Spec.AnswerWeight": "sft.answer_weight",
	"sftdirect.Spec.Seed":         "train.seed",
	"sftdirect.Spec.Beta1":        "train.beta1",
	"sftdirect.Spec.Beta2":        "train.beta2",
	"sftdirect.Spec.AdamEps":      "train.adam_eps",
	"sftdirect.Spec.WeightDecay":  "train.weight_decay",
	"sftdirect.Spec.MaxGradNorm":  "train.max_grad_norm",
	"sftdirect.Spec.MicroBatch":   "train.micro_batch",

	"serve.RequestTrace.Time":      "when the request arrived (UTC)",
	"serve.RequestTrace.RequestID": "the request's id (X-Request-Id)",
	"serve.RequestTrace.Model":     "the router's model id",
	"serve.RequestTrace.User":      "the request's user field",
	"serve.RequestTrace.Question":  "the question (the last user message)",
	"serve.RequestTrace.Answer":    "the answer returned (the last <answer>)",
	"serve.RequestTrace.Response":  "the router's whole output, with the <information> blocks",
	"serve.RequestTrace.Calls":     "the pool calls, in order",
	"serve.RequestTrace.End":       `why the router stopped: "answer", "eos", "length", "final", …`,
	"serve.RequestTrace.Tokens":    "tokens the policy wrote",
	"serve.RequestTrace.Usage":     "the policy's and the pool's tokens",
	"serve.RequestTrace.CostUSD":   "the pool calls' cost in USD at list prices",
	"serve.RequestTrace.Status":    "the HTTP status returned",
	"serve.RequestTrace.Error":     "the error returned, if any",
	"serve.RequestTrace.LatencyMS": "the request's wall time in milliseconds",
	"serve.RequestTrace.Request":   "the request's settings",

	"serve.recalUsage.PolicyPromptTokens":     "prompt tokens the policy read",
	"serve.recalUsage.PolicyCompletionTokens": "tokens the policy wrote",
	"serve.recalUsage.PoolPromptTokens":       "prompt tokens of the pool calls",
	"serve.recalUsage.PoolCompletionTokens":   "completion tokens of the pool calls",
	"serve.traceRequest.Models":               "recal.models: the pool models the router could call",
	"serve.traceRequest.MaxTurns":             "recal.max_turns",
	"serve.traceRequest.MaxCostUSD":           "recal.max_cost_usd",
	"serve.traceRequest.Temperature":          "temperature",
	"serve.traceRequest.TopP":                 "top_p",
	"serve.traceRequest.MaxTokens":            "max_tokens (or max_completion_tokens)",
	"serve.traceRequest.Stream":               "stream",
}

// parseConfigFile loads a configuration file as written: relative paths
// stay relative (Load would make them absolute, machine-dependent).
func parseConfigFile(path string) (config.Config, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return config.Config{}, err
	}
	return config.Parse(filepath.Base(path), text, nil)
}

// TestDocsMethodDefaults checks docs/method.md's table of defaults
// (section "Defaults") against the code: each row's "code default" column
// against config.Default() and its recal.toml column against recal.toml, so
// the method page never quotes a value the code or the offline default no
// longer has; and every [train] or [calibration] key that recal.toml sets
// away from its default, and that a resume may not change, has a row.
func TestDocsMethodDefaults(t *testing.T) {
	text, err := os.ReadFile("../../docs/method.md")
	if err != nil {
		t.Fatal(err)
	}
	rows, err := methodDefaultsRows(string(text))
	if err != nil {
		t.Fatalf("docs/method.md: %v", err)
	}
	offline, err := parseConfigFile("../../recal.toml")
	if err != nil {
		t.Fatal(err)
	}
	columns := []struct {
		name string
		tree map[string]any
	}{
		{"code default", configTree(t, config.Default())},
		{"recal.toml", configTree(t, offline)},
	}
	quoted := map[string]bool{}
	for _, r := range rows {
		t.Run(strings.Join(r.keys, ","), func(t *testing.T) {
			for ci, col := range columns {
				cellText := r.cells[ci]
				if cellText == "same" { // the row's code default
					cellText = r.cells[0]
				}
				vals := splitValues(cellText)
				if len(vals) != len(r.keys) {
					t.Fatalf("docs/method.md line %d: the %s column %q holds %d value(s) for %d key(s) %v; want one per key",
						r.line, col.name, r.cells[ci], len(vals), len(r.keys), r.keys)
				}
				for i, k := range r.keys {
					actual, ok := lookupKey(col.tree, k)
					if !ok {
						t.Errorf("docs/method.md line %d: key %s is not a configuration key", r.line, k)
						continue
					}
					if !sameValue(vals[i], actual) {
						t.Errorf("docs/method.md line %d: %s: the %s column says %s, but it is %v; correct the page",
							r.line, k, col.name, vals[i], actual)
					}
				}
			}
		})
		for _, k := range r.keys {
			quoted[k] = true
		}
	}
	// Every training key recal.toml changes, so that a reader of the method
	// page knows how the offline default departs from the paper's defaults.
	keys := flatKeys(columns[1].tree, "")
	sort.Strings(keys)
	for _, k := range keys {
		if !strings.HasPrefix(k, "train.") && !strings.HasPrefix(k, "calibration.") || config.OperationalKey(k) {
			continue
		}
		def, _ := lookupKey(columns[0].tree, k)
		off, _ := lookupKey(columns[1].tree, k)
		if fmt.Sprint(def) != fmt.Sprint(off) && !quoted[k] {
			t.Errorf("docs/method.md section \"Defaults\" has no row for %s (code default %v, recal.toml %v): the table should list every training key recal.toml changes", k, def, off)
		}
	}
}

// methodRow is one row of method.md's table of defaults.
type methodRow struct {
	line  int
	keys  []string  // full dotted keys
	cells [2]string // code default, recal.toml
}

var backticked = regexp.MustCompile("`([^`]+)`")

// methodDefaultsRows reads the table under "## 11. Defaults" (any section
// titled "Defaults"): columns key, code default, paper, recal.toml. A key
// cell names its keys in backticks; a key without a dot belongs to the
// table of the first one (`train.batch_size` × `group_size`).
func methodDefaultsRows(text string) ([]methodRow, error) {
	lines := strings.Split(text, "\n")
	start := -1
	for i, l := range lines {
		if strings.HasPrefix(l, "## ") && strings.HasSuffix(strings.TrimSpace(l), "Defaults") {
			start = i
			break
		}
	}
	if start < 0 {
		return nil, fmt.Errorf("no section titled \"Defaults\"")
	}
	var rows []methodRow
	header := false
	for i := start + 1; i < len(lines) && !strings.HasPrefix(lines[i], "## "); i++ {
		l := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(l, "|") {
			if header {
				break // the end of the table
			}
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		for j := range cells {
			cells[j] = strings.TrimSpace(cells[j])
		}
		if !header {
			want := []string{"key", "code default", "paper", "`recal.toml`"}
			if fmt.Sprint(cells) != fmt.Sprint(want) {
				return nil, fmt.Errorf("line %d: the table's columns are %q, want %q", i+1, cells, want)
			}
			header = true
			i++ // the --- row
			continue
		}
		if len(cells) != 4 {
			return nil, fmt.Errorf("line %d: %d cells, want 4", i+1, len(cells))
		}
		r := methodRow{line: i + 1, cells: [2]string{cells[1], cells[3]}}
		table := ""
		for _, m := range backticked.FindAllStringSubmatch(cells[0], -1) {
			k := m[1]
			if dot := strings.LastIndex(k, "."); dot >= 0 {
				table = k[:dot+1]
			} else {
				k = table + k
			}
			r.keys = append(r.keys, k)
		}
		if len(r.keys) == 0 || table == "" {
			return nil, fmt.Errorf("line %d: the key cell %q names no dotted key in backticks (the test checks every row)", i+1, cells[0])
		}
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("the \"Defaults\" section holds no table")
	}
	return rows, nil
}

// splitValues splits a cell of several values ("64 × 4", "0.8, 1.25").
func splitValues(cell string) []string {
	cell = strings.ReplaceAll(cell, "×", ",")
	var out []string
	for _, v := range strings.Split(cell, ",") {
		out = append(out, strings.Trim(strings.TrimSpace(v), "`"))
	}
	return out
}

// sameValue reports whether the page's text v states the value x.
func sameValue(v string, x any) bool {
	switch x := x.(type) {
	case int64:
		f, err := strconv.ParseFloat(v, 64)
		return err == nil && f == float64(x)
	case float64:
		f, err := strconv.ParseFloat(v, 64)
		return err == nil && f == x
	case bool:
		b, err := strconv.ParseBool(v)
		return err == nil && b == x
	case string:
		if s, err := strconv.Unquote(v); err == nil {
			v = s
		}
		return v == x
	}
	return fmt.Sprint(x) == v
}

// configTree is c as its TOML encoding decodes into maps.
func configTree(t *testing.T, c config.Config) map[string]any {
	t.Helper()
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(c); err != nil {
		t.Fatal(err)
	}
	tree := map[string]any{}
	if _, err := toml.Decode(buf.String(), &tree); err != nil {
		t.Fatal(err)
	}
	return tree
}

// lookupKey returns the value of a dotted key of tree.
func lookupKey(tree map[string]any, key string) (any, bool) {
	var cur any = tree
	for _, part := range strings.Split(key, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[part]; !ok {
			return nil, false
		}
	}
	return cur, true
}

// flatKeys lists the dotted keys of tree's leaves (tables of tables only;
// an array counts as one leaf).
func flatKeys(tree map[string]any, prefix string) []string {
	var out []string
	for k, v := range tree {
		if m, ok := v.(map[string]any); ok {
			out = append(out, flatKeys(m, prefix+k+".")...)
		} else {
			out = append(out, prefix+k)
		}
	}
	return out
}
