package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/recal-project/recal/experiments/frontier"
)

// recal frontier on a replayed world: a pool with a free model, a one-model
// router family swept over two cost_lambdas, the cascade; a rerun reuses
// every step and writes the same frontier; hostile sweeps stop before
// anything is written.
func TestFrontierOnReplayWorld(t *testing.T) {
	w := newReplayWorld(t, "")
	models := worldReplayModels + `[[pool.models]]
name = "free"
description = "the guesser's answers at no cost"
price_in = 0.0
price_out = 0.0
provider = "replay"
  [pool.models.replay]
  log = "log.jsonl"
  model = "guesser"
  render = "judgment"
`
	cfg := worldConfig(t, w.dir, models, "")
	work := filepath.Join(w.dir, "frontier")
	args := []string{"--threads", "2", "frontier", "--config", cfg, "--work", work, "--datasets", "nq,triviaqa", "--routers", "mlp", "--cost-lambdas", "0,1"}
	code, stdout, stderr := runCLI(t, args...)
	if code != 0 {
		t.Fatalf("frontier: exit %d: %s", code, stderr)
	}
	if !strings.Contains(stderr, "fitting") {
		t.Fatalf("the first run logged no fit, so the rerun's silence would say nothing:\n%s", stderr)
	}
	for _, f := range []string{"frontier.json", "frontier.csv", "frontier.md", "frontier.png", "frontier.svg"} {
		if st, err := os.Stat(filepath.Join(work, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	first := readFile(t, filepath.Join(work, "frontier.json"))
	var rep frontier.Report
	if err := json.Unmarshal(first, &rep); err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, p := range rep.Points {
		count[p.Family]++
		if p.Label == "free" && p.Cost != 0 {
			t.Errorf("the free model's point costs %v, want 0", p.Cost)
		}
		if p.Mark == "" {
			t.Errorf("point %s has no mark against the hull", p.Label)
		}
	}
	if count[frontier.FamilySingle] != 3 || count["mlp"] != 2 || count[frontier.FamilyCascade] < 2 || count[frontier.FamilyOracle] != 1 {
		t.Errorf("points per family %v, want 3 single models, mlp at 2 cost_lambdas, the cascade's sweep, the oracle", count)
	}
	if len(rep.Families) != 4 || !strings.Contains(stdout, "### Families") {
		t.Errorf("families %d, want single, mlp, cascade, oracle; stdout:\n%s", len(rep.Families), stdout)
	}
	code, _, stderr = runCLI(t, args...)
	if code != 0 {
		t.Fatalf("frontier again: exit %d: %s", code, stderr)
	}
	if strings.Contains(stderr, "fitting") || strings.Contains(stderr, "starting afresh") {
		t.Errorf("the rerun refitted or re-asked:\n%s", stderr)
	}
	if !bytes.Equal(first, readFile(t, filepath.Join(work, "frontier.json"))) {
		t.Error("the rerun wrote another frontier.json")
	}

	for _, c := range []struct{ flag, value, want string }{
		{"--cost-lambdas", "nan", "--cost-lambdas = NaN"},
		{"--cost-lambdas", "-0.5", "--cost-lambdas = -0.5"},
		{"--cost-lambdas", "", "--cost-lambdas is empty"},
		{"--thresholds", "0.5,1.2", "--thresholds = 1.2"},
		{"--thresholds", "", "--thresholds is empty"},
	} {
		fresh := filepath.Join(w.dir, "hostile")
		code, _, stderr := runCLI(t, "frontier", "--config", cfg, "--work", fresh, c.flag, c.value)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("%s %q: exit %d, stderr %q; want 2 naming %q", c.flag, c.value, code, stderr, c.want)
		}
		if _, err := os.Stat(fresh); !os.IsNotExist(err) {
			t.Errorf("%s %q: the work folder was made (%v): nothing may be written before the sweep is checked", c.flag, c.value, err)
		}
	}
}
