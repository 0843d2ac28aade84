package ablate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/recal-project/recal/calibration"
	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/eval"
	"github.com/recal-project/recal/internal/plot"
	"github.com/recal-project/recal/internal/runlock"
	"github.com/recal-project/recal/internal/testing/testenv"
	"github.com/recal-project/recal/internal/testing/testpolicy"
	"github.com/recal-project/recal/trainer"
)

// ablateConfig is the offline default cut to seconds (a micro policy, four
// training questions per dataset, two test questions per dataset), with
// two warm-up and two GRPO steps, so that a variant's GRPO both starts from
// the warm-up and carries state from one step to the next.
func ablateConfig(t *testing.T) config.Config {
	t.Helper()
	ck := testpolicy.Micro(t, "../..", 1)
	cfg, err := config.Load("../../recal.toml", []string{
		"policy.checkpoint=" + ck, "policy.threads=2",
		"data.train_per_dataset=4", "data.val_per_dataset=2", "data.test_per_dataset=2",
		"router.turn_tokens=8", "router.info_tokens=8", "router.max_turns=1",
		"sft.steps=1", "sft.batch_size=2", "train.steps=1", "train.batch_size=2", "train.group_size=2",
		"train.micro_batch=4", "train.checkpoint_every=1", "train.validate_every=1", "eval.batch=8",
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg.SFT.Steps, cfg.Train.Steps = 2, 2
	cfg.Train.CheckpointEvery, cfg.Train.ValidateEvery = 2, 0 // one checkpoint and one validation, at the end
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// withoutTimes drops the wall-clock fields of metrics.jsonl lines.
func withoutTimes(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		for k := range m {
			if strings.HasSuffix(k, "time_s") || k == "tokens_per_s" {
				delete(m, k)
			}
		}
		s, _ := json.Marshal(m)
		out = append(out, string(s))
	}
	return strings.Join(out, "\n")
}

func sameFile(t *testing.T, a, b string) bool {
	t.Helper()
	x, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(x, y)
}

// A variant's GRPO continuing the shared warm-up (a warm-up run with
// train.steps = 0 and the full calibration, then Seed and a resumed
// run) computes exactly what one `recal train` of warm-up + GRPO with the
// variant's configuration computes: the same responses, rewards and
// advantages, the same metrics and the same final weights and optimizer
// state. Otherwise sharing the warm-up would change the study.
func TestAblateSharedWarmupEqualsCombinedRun(t *testing.T) {
	cfg := ablateConfig(t)
	ctx := context.Background()
	for _, reset := range []bool{true, false} {
		t.Run(fmt.Sprintf("reset_optimizer_after_sft=%v", reset), func(t *testing.T) {
			vc := cfg
			vc.Train.ResetOptimizerAfterSFT = reset
			edit, err := calibration.Ablation("wo_both") // another calibration than the warm-up's
			if err != nil {
				t.Fatal(err)
			}
			edit(&vc.Calibration)
			root := t.TempDir()
			combined := filepath.Join(root, "combined")
			if err := trainer.Train(ctx, vc.Training(), trainer.Options{RunDir: combined, Log: quietLog()}); err != nil {
				t.Fatal(err)
			}
			warm, split := filepath.Join(root, "warmup"), filepath.Join(root, "split")
			if err := trainer.Train(ctx, WarmupConfig(vc).Training(), trainer.Options{RunDir: warm, Log: quietLog()}); err != nil {
				t.Fatal(err)
			}
			before := testenv.Mtimes(t, warm)
			if err := Seed(split, warm, vc); err != nil {
				t.Fatal(err)
			}
			if err := trainer.Train(ctx, vc.Training(), trainer.Options{RunDir: split, Resume: true, Log: quietLog()}); err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{"model.safetensors", "optimizer.safetensors", "trainer_state.json"} {
				if !sameFile(t, filepath.Join(combined, "checkpoints", "sft", f), filepath.Join(warm, "checkpoints", "sft", f)) {
					t.Errorf("warm-up %s differs from the combined run's: the warm-up must not depend on [calibration] or train.steps", f)
				}
				if !sameFile(t, filepath.Join(combined, "checkpoints", "step-2", f), filepath.Join(split, "checkpoints", "step-2", f)) {
					t.Errorf("step-2/%s differs between the combined run and the run continuing the shared warm-up", f)
				}
			}
			for _, f := range []string{"rollouts.jsonl", "sft.jsonl", "validation.jsonl"} {
				if !sameFile(t, filepath.Join(combined, f), filepath.Join(split, f)) {
					t.Errorf("%s differs between the combined run and the run continuing the shared warm-up", f)
				}
			}
			if a, b := withoutTimes(t, filepath.Join(combined, "metrics.jsonl")), withoutTimes(t, filepath.Join(split, "metrics.jsonl")); a != b {
				t.Errorf("metrics.jsonl differs (times aside):\ncombined %s\nsplit    %s", a, b)
			}
			for p, m := range testenv.Mtimes(t, warm) {
				if !before[p].Equal(m) {
					t.Errorf("%s changed: the variant's run wrote into the shared warm-up", p)
				}
			}
		})
	}
}

// studyFiles maps the files of a study folder that training and
// evaluation write, to their modification times: every file but the tables
// (written again by every invocation, with the same contents) and the
// figure.
func studyFiles(t *testing.T, root string) map[string]time.Time {
	t.Helper()
	out := testenv.Mtimes(t, root)
	for p := range out {
		base := filepath.Base(p)
		if strings.HasPrefix(base, "table.") || strings.HasPrefix(base, "ablation") {
			delete(out, p)
		}
	}
	return out
}

// studyVariants are the rows the study tests train: the two ends of the
// table, full ReCal and w/o both (every variant trains the same way).
var studyVariants = []Variant{Variants[0], Variants[len(Variants)-1]}

func studyOptions(root string, seeds ...int64) Options {
	return Options{Root: root, Seeds: seeds, Split: "id", Window: 1, Log: quietLog(), variants: studyVariants}
}

// A study folder another process works in (a second recal ablate on it)
// is refused at once, naming that process, before anything is trained or
// written.
func TestAblateRefusesAFolderInUse(t *testing.T) {
	cfg := ablateConfig(t)
	root := t.TempDir()
	held, err := runlock.Acquire(root, "recal ablate")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	_, err = Run(context.Background(), cfg, studyOptions(root, 0))
	want := fmt.Sprintf("in use by pid %d", os.Getpid())
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("ablate on a study folder in use: %v; want an error saying %q", err, want)
	}
	entries, _ := os.ReadDir(root)
	if len(entries) != 1 || entries[0].Name() != runlock.File {
		t.Fatalf("the refused study wrote into the folder in use: it holds %v, want the holder's %s alone", entries, runlock.File)
	}
}

// recal ablate over two seeds trains one warm-up per seed and reuses it in
// every variant (linked, never retrained or written); run again when done,
// it trains and evaluates nothing and writes the same table. The table's
// mean ± std are those of the per-seed evaluations.
func TestAblateSharesTheWarmup(t *testing.T) {
	cfg := ablateConfig(t)
	ctx := context.Background()
	seeds := []int64{0, 1}
	full := t.TempDir()
	o := studyOptions(full, seeds...)
	warmTimes := map[int64]map[string]time.Time{}
	o.runDone = func(seed int64, variant string) {
		if variant == studyVariants[0].Name { // the seed's first run: its warm-up is complete
			warmTimes[seed] = testenv.Mtimes(t, WarmupDir(full, seed))
		}
	}
	rep, err := Run(ctx, cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	if want := len(seeds) * (1 + len(studyVariants)); len(rep.Trained) != want {
		t.Errorf("trained %d runs %v, want %d: one warm-up per seed, one run per variant and seed", len(rep.Trained), rep.Trained, want)
	}
	for _, seed := range seeds {
		warm := WarmupDir(full, seed)
		for p, m := range testenv.Mtimes(t, warm) {
			if !warmTimes[seed][p].Equal(m) {
				t.Errorf("%s changed after the first variant: the shared warm-up was trained or written again", p)
			}
		}
		for _, v := range studyVariants {
			dir := VariantDir(full, seed, v.Name)
			sft := filepath.Join(dir, "checkpoints", "sft")
			if fi, err := os.Lstat(sft); err != nil || fi.Mode()&os.ModeSymlink == 0 {
				t.Errorf("%s: %v; want a link to the seed's warm-up, not a warm-up of its own", sft, err)
			} else if got := mustEval(t, sft); got != mustEval(t, filepath.Join(warm, "checkpoints", "sft")) {
				t.Errorf("%s names %s, want seed %d's warm-up", sft, got, seed)
			}
			if !sameFile(t, filepath.Join(dir, "sft.jsonl"), filepath.Join(warm, "sft.jsonl")) {
				t.Errorf("%s/sft.jsonl is not the warm-up's log", dir)
			}
			if done, err := trainer.Finished(dir, cfg.Train.Steps); err != nil || !done {
				t.Errorf("%s: finished %v (%v), want its %d steps done", dir, done, err, cfg.Train.Steps)
			}
		}
	}
	// Each cell is the mean ± sample std of the runs' own evaluations.
	for _, row := range rep.Table.Rows {
		for _, col := range rep.Table.Columns {
			var xs []float64
			for _, seed := range seeds {
				var et eval.Table
				b, err := os.ReadFile(filepath.Join(VariantDir(full, seed, row.Name), "eval-id", "table.json"))
				if err != nil {
					t.Fatal(err)
				}
				if err := json.Unmarshal(b, &et); err != nil {
					t.Fatal(err)
				}
				switch col {
				case ColInDomain, ColAverage: // the split is nq and hotpotqa
					xs = append(xs, (et.Rows[0].Datasets["nq"].EM+et.Rows[0].Datasets["hotpotqa"].EM)/2)
				case ColCost:
					xs = append(xs, et.Rows[0].CostPerQuestion)
				default:
					xs = append(xs, et.Rows[0].Datasets[col].EM)
				}
			}
			mean := (xs[0] + xs[1]) / 2
			std := math.Abs(xs[0]-xs[1]) / math.Sqrt2 // two values: √((a-m)²+(b-m)²) over n-1 = 1
			if got := row.Cells[col]; math.Abs(got.Mean-mean) > 1e-12 || math.Abs(got.Std-std) > 1e-12 {
				t.Errorf("%s %s = %v, want %.6f ± %.6f from the per-seed evaluations %v", row.Name, col, got, mean, std, xs)
			}
		}
	}
	for _, f := range []string{"ablation.json", "ablation.csv", "ablation.md", plot.AblationFigure + ".png", plot.AblationFigure + ".svg"} {
		if !exists(filepath.Join(full, f)) {
			t.Errorf("the study wrote no %s", f)
		}
	}
	// The reference rows: every pool model's answers to the split's
	// questions, once for the study, in reference-id.
	refs := rep.Table.References
	if len(refs) != 3 || refs[0].Name != eval.RefOracle || refs[1].Name != eval.RefBest || refs[2].Name != eval.RefCheapest {
		t.Fatalf("reference rows %+v, want oracle, best and cheapest single model", refs)
	}
	for _, c := range rep.Table.Columns {
		if c != ColCost && refs[0].Cells[c].Mean < refs[1].Cells[c].Mean {
			t.Errorf("%s: oracle %v below the best single model's %v", c, refs[0].Cells[c], refs[1].Cells[c])
		}
	}
	if refs[2].Cells[ColCost].Mean <= 0 || refs[2].Cells[ColCost].Mean > refs[1].Cells[ColCost].Mean {
		t.Errorf("cheapest single model costs %v per question, the best %v", refs[2].Cells[ColCost], refs[1].Cells[ColCost])
	}
	for _, m := range cfg.Pool.Models {
		if !exists(filepath.Join(full, "reference-id", eval.ModelResultsFile(m.Name))) {
			t.Errorf("no reference answers of pool model %s in reference-id", m.Name)
		}
	}

	// Run again when done: nothing is trained or evaluated again.
	before := studyFiles(t, full)
	again, err := Run(ctx, cfg, studyOptions(full, seeds...))
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Trained) != 0 {
		t.Errorf("a finished study run again trained %v, want nothing", again.Trained)
	}
	after := studyFiles(t, full)
	for p, m := range before {
		if !after[p].Equal(m) {
			t.Errorf("%s was written again by a finished study", p)
		}
	}
	want, _ := json.Marshal(rep.Table)
	if got, _ := json.Marshal(again.Table); !bytes.Equal(got, want) {
		t.Errorf("a finished study run again gives another table:\n%s\nwant\n%s", got, want)
	}
}

// Stopped after its first run (as SIGINT stops it: the context is
// cancelled) and started again, recal ablate redoes neither the warm-up nor
// that run and ends with the uninterrupted study's table.
func TestAblateResumesAfterAStop(t *testing.T) {
	cfg := ablateConfig(t)
	ctx := context.Background()
	ref, err := Run(ctx, cfg, studyOptions(t.TempDir(), 5))
	if err != nil {
		t.Fatal(err)
	}

	root := t.TempDir()
	stop, cancel := context.WithCancel(ctx)
	defer cancel()
	o := studyOptions(root, 5)
	o.runDone = func(int64, string) { cancel() }
	if _, err := Run(stop, cfg, o); !errors.Is(err, trainer.ErrInterrupted) {
		t.Fatalf("stopped study: error %v, want trainer.ErrInterrupted", err)
	}
	warm, first := WarmupDir(root, 5), VariantDir(root, 5, studyVariants[0].Name)
	if entries, _ := os.ReadDir(SeedDir(root, 5)); len(entries) != 2 {
		t.Errorf("stopped after its first run the study holds %v, want the warm-up and that run alone", entries)
	}
	done := studyFiles(t, root)

	// Stopped again in the middle of the second run, after its first step:
	// the run saves that step and stops.
	stop, cancel = context.WithCancel(ctx)
	defer cancel()
	o = studyOptions(root, 5)
	o.Log = slog.New(cancelOn{"step", cancel})
	if _, err := Run(stop, cfg, o); !errors.Is(err, trainer.ErrInterrupted) {
		t.Fatalf("study stopped mid-run: error %v, want trainer.ErrInterrupted", err)
	}
	second := VariantDir(root, 5, studyVariants[1].Name)
	if at, err := trainer.Finished(second, 1); err != nil || !at {
		t.Errorf("the run stopped after its first step: checkpoints/last at step 1 %v (%v), want a checkpoint of that step", at, err)
	}

	resumed, err := Run(ctx, cfg, studyOptions(root, 5))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{second}; !slices.Equal(resumed.Trained, want) {
		t.Errorf("the continued study trained %v, want %v alone (not %s or %s again)", resumed.Trained, want, warm, first)
	}
	now := studyFiles(t, root)
	for p, m := range done {
		if !now[p].Equal(m) {
			t.Errorf("%s, done before the first stop, was written again", p)
		}
	}
	want, _ := json.Marshal(ref.Table)
	if got, _ := json.Marshal(resumed.Table); !bytes.Equal(got, want) {
		t.Errorf("the stopped and continued study's table differs from the uninterrupted one's:\n%s\nwant\n%s", got, want)
	}
}

// cancelOn is a log handler that calls cancel on a record with message msg
// (the trainer logs "step" after a step), as a SIGINT then would.
type cancelOn struct {
	msg    string
	cancel func()
}

func (h cancelOn) Enabled(context.Context, slog.Level) bool { return true }
func (h cancelOn) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.cancel()
	}
	return nil
}
func (h cancelOn) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h cancelOn) WithGroup(string) slog.Handler      { return h }

func mustEval(t *testing.T, p string) string {
	t.Helper()
	r, err := filepath.EvalSymlinks(p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
