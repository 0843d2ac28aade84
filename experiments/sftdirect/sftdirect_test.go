package sftdirect_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/experiments/sftdirect"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/router"
	"github.com/recal-project/recal/torchbridge"
)

// A direct-answer demonstration is the direct prompt (no model listed) and
// one turn "<think>…</think>\n<answer> GOLDEN</answer>": the loss covers
// the turn only, the answer with sft.answer_weight; questions without a
// golden answer give none.
func TestDirectDemos(t *testing.T) {
	ck := microCheckpoint(t)
	cfg := testConfig(t, ck)
	eng, err := rollout.OpenEngine(ck, torchbridge.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	qs := []data.Example{
		{ID: "nq-1", Dataset: "nq", Question: "who wrote the iliad", Golden: []string{" ", "Homer"}},
		{ID: "nq-2", Dataset: "nq", Question: "a question without an answer"},
	}
	demos, err := sftdirect.Demos(eng, cfg.Router, qs, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(demos) != 1 {
		t.Fatalf("%d demonstrations, want 1 (the question without a golden answer has none)", len(demos))
	}
	d := demos[0]
	ids := func(m func(float32) bool) []int {
		var out []int
		for i, v := range d.Tokens {
			if m(d.Mask[i]) {
				out = append(out, int(v))
			}
		}
		return out
	}
	all := ids(func(float32) bool { return true })
	text := eng.Tok.Decode(all)
	if strings.Contains(text, "sim-factoid") {
		t.Errorf("the direct prompt lists pool models:\n%s", text)
	}
	if !strings.Contains(text, "who wrote the iliad") {
		t.Errorf("the prompt lacks the question:\n%s", text)
	}
	turn := eng.Tok.Decode(ids(func(m float32) bool { return m > 0 }))
	want := router.ThinkOpen + "I will answer from what I know." + router.ThinkClose + "\n" + router.AnswerOpen + " Homer" + router.AnswerClose
	if turn != want {
		t.Errorf("trained tokens decode to %q, want %q (the turn, nothing of the prompt)", turn, want)
	}
	answer := eng.Tok.Decode(ids(func(m float32) bool { return m == 3 }))
	if answer != router.AnswerOpen+" Homer"+router.AnswerClose {
		t.Errorf("tokens weighted by answer_weight decode to %q, want the answer element", answer)
	}
}

// TrainSFTDirect changes every weight it trains, saves a loadable folder
// with its manifest, and SFTDirectReady reuses it only for the same inputs.
func TestTrainSFTDirect(t *testing.T) {
	ck := microCheckpoint(t)
	cfg := testConfig(t, ck, "sft.steps=3")
	out := filepath.Join(t.TempDir(), "sft-direct")
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	opt := sftdirect.Options{Out: out, BaseID: "sha256:base", Log: quiet}
	spec, err := sftdirect.SpecOf(cfg, opt)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := sftdirect.Ready(out, spec); ok || err != nil {
		t.Fatalf("SFTDirectReady of a missing folder = %v, %v; want false, nil", ok, err)
	}
	if err := sftdirect.Train(context.Background(), cfg, opt); err != nil {
		t.Fatal(err)
	}
	base, err := os.ReadFile(filepath.Join(ck, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	tuned, err := os.ReadFile(filepath.Join(out, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(base, tuned) {
		t.Error("the SFT-direct weights equal the starting ones: nothing was trained")
	}
	eng, err := rollout.OpenEngine(out, torchbridge.Options{})
	if err != nil {
		t.Fatalf("the SFT-direct folder does not load as a policy: %v", err)
	}
	eng.Close()
	lines := readJSONL(t, filepath.Join(out, "sft.jsonl"))
	if len(lines) != 3 || lines[0]["stage"] != "sft-direct" {
		t.Errorf("sft.jsonl holds %v, want 3 lines of stage sft-direct", lines)
	}
	if ok, err := sftdirect.Ready(out, spec); !ok || err != nil {
		t.Errorf("SFTDirectReady of the folder just trained = %v, %v; want true (reused)", ok, err)
	}
	for _, c := range []struct {
		name string
		edit func(*sftdirect.Spec)
		key  string
	}{
		{"more steps", func(s *sftdirect.Spec) { s.Steps = 4 }, "steps"},
		{"other starting weights", func(s *sftdirect.Spec) { s.BaseID = "sha256:other" }, "base_id"},
		{"other data", func(s *sftdirect.Spec) { s.Data.TrainPerDataset = 1 }, "data"},
	} {
		t.Run(c.name, func(t *testing.T) {
			other := spec
			c.edit(&other)
			ok, err := sftdirect.Ready(out, other)
			if ok || !errors.Is(err, sftdirect.ErrOther) || !strings.Contains(err.Error(), c.key) {
				t.Errorf("SFTDirectReady = %v, %v; want ErrSFTDirectOther naming %q: a folder of other inputs must not be reused", ok, err, c.key)
			}
		})
	}
}
