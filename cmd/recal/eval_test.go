package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/internal/testing/testpolicy"
)

// recal eval asked for a router without what it is made from fails with
// status 2 or 1 and a message naming the command that makes it.
func TestEvalNamesTheMissingCommand(t *testing.T) {
	ck := smallCheckpoint(t)
	cases := []struct {
		router, want string
	}{
		{"sft", "recal train-sft-direct"},
		{"mlp", "recal fit"},
		{"knn-decomp", "--knn-log"},
	}
	for _, c := range cases {
		t.Run(c.router, func(t *testing.T) {
			code, _, stderr := runCLI(t, "--threads", "2", "eval", "--config", "../../recal.toml", "--checkpoint", ck, "--routers", c.router, "--datasets", "nq",
				"--set", "data.test_per_dataset=1", "--set", "router.turn_tokens=8", "--out", t.TempDir())
			if code == 0 || !strings.Contains(stderr, c.want) {
				t.Errorf("exit %d, stderr %q; want a failure naming %q", code, stderr, c.want)
			}
		})
	}
}

// recal eval --dry-run lists what the no-routing and decomposition rows
// lack, naming the flag or command that supplies it.
func TestDryRunEvalNewRows(t *testing.T) {
	ck := testpolicy.Micro(t, "../..", 1)
	code, _, stderr := runCLI(t, "eval", "--config", "../../recal.toml", "--checkpoint", ck, "--datasets", "nq", "--dry-run",
		"--routers", "sft,knn-decomp,cot", "--cot-template", filepath.Join(t.TempDir(), "none.tmpl"))
	if code != 2 {
		t.Fatalf("exit status %d, want 2; stderr: %s", code, stderr)
	}
	got := strings.Join(problemLines(t, stderr), "\n")
	for _, want := range []string{"knn-decomp needs logged outcomes: --knn-log", "sft needs --sft-checkpoint DIR, made by `recal train-sft-direct", "none.tmpl does not exist"} {
		if !strings.Contains(got, want) {
			t.Errorf("problems\n%s\nlack %q", got, want)
		}
	}
}

// recal eval --split val evaluates the validation questions training
// holds out (data.Config.LoadTrain's), not test questions; ablate, which
// reports test scores only, refuses the name.
func TestEvalSplitVal(t *testing.T) {
	sets := []string{"data.val_per_dataset=3"}
	cfg, err := config.Load("../../recal.toml", sets)
	if err != nil {
		t.Fatal(err)
	}
	_, val, err := cfg.Data.LoadTrain()
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, ex := range val {
		want = append(want, ex.ID)
	}
	out := t.TempDir()
	code, _, stderr := runCLI(t, "--threads", "2", "eval", "--config", "../../recal.toml", "--checkpoint", smallCheckpoint(t), "--set", sets[0], "--routers", "random", "--split", "val", "--out", out)
	if code != 0 {
		t.Fatalf("exit status %d; stderr: %s", code, stderr)
	}
	f, err := os.Open(filepath.Join(out, "results-random.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got []string
	for sc := bufio.NewScanner(f); sc.Scan(); {
		var r struct{ ID string }
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		got = append(got, r.ID)
	}
	slices.Sort(got)
	slices.Sort(want)
	if len(want) != 6 || !slices.Equal(got, want) {
		t.Errorf("evaluated %v, want the validation questions %v (3 of each training dataset)", got, want)
	}
	if code, _, stderr := runCLI(t, "ablate", "--config", "../../recal.toml", "--split", "val", "--run-dir", t.TempDir()); code != 2 || !strings.Contains(stderr, `"val"`) {
		t.Errorf("ablate --split val: exit %d, stderr %q; want 2 naming the split", code, stderr)
	}
}
