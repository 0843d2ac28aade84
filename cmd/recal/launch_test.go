package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/recal-project/recal/internal/hfmodel"
)

// asRecalEnv makes the test binary run as recal (TestMain), so that
// recal --nproc can start it as its ranks.
const asRecalEnv = "RECAL_TEST_AS_RECAL"

func TestWithoutFlag(t *testing.T) {
	cases := []struct{ in, want []string }{
		{[]string{"train", "--nproc", "2", "--config", "x"}, []string{"train", "--config", "x"}},
		{[]string{"train", "--nproc=2", "--config", "x"}, []string{"train", "--config", "x"}},
		{[]string{"train", "-nproc", "2"}, []string{"train"}},
		{[]string{"--threads", "1", "eval", "-nproc=4", "--nprocs", "1"}, []string{"--threads", "1", "eval", "--nprocs", "1"}},
		{[]string{"train", "--", "--nproc", "2"}, []string{"train", "--", "--nproc", "2"}},
	}
	for _, c := range cases {
		if got := withoutFlag(c.in, "nproc"); !reflect.DeepEqual(got, c.want) {
			t.Errorf("withoutFlag(%q) = %q, want %q: the ranks must get the command line less --nproc", c.in, got, c.want)
		}
	}
}

// recal eval --nproc 2 starts two ranks that share the questions, and rank 0
// writes the same tables and results as one process; a batch size that the
// ranks cannot split into whole groups is refused before any work.
func TestNprocEval(t *testing.T) {
	ck := smallCheckpoint(t)
	cfg, err := hfmodel.LoadConfig(ck)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxPositionEmbeddings = 2048 // room for the prompts
	b, _ := cfg.MarshalJSON()
	if err := os.WriteFile(filepath.Join(ck, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	args := func(out string) []string {
		return []string{"--threads", "1", "eval", "--config", "../../recal.toml", "--checkpoint", ck, "--datasets", "nq,popqa",
			"--routers", "policy,random", "--out", out, "--set", "data.test_per_dataset=5", "--set", "eval.batch=2",
			"--set", "router.turn_tokens=8", "--set", "router.max_turns=1", "--set", "router.info_tokens=4"}
	}
	one, two := filepath.Join(t.TempDir(), "one"), filepath.Join(t.TempDir(), "two")
	if code, _, stderr := runCLI(t, args(one)...); code != 0 {
		t.Fatalf("eval in one process: exit %d: %s", code, stderr)
	}
	cmd := exec.Command(os.Args[0], append(args(two), "--nproc", "2")...)
	cmd.Env = append(os.Environ(), asRecalEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("eval --nproc 2: %v\n%s", err, out)
	}
	for _, f := range []string{"table.json", "table.csv", "table.md", "results-policy.jsonl", "results-random.jsonl"} {
		a, err := os.ReadFile(filepath.Join(one, f))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(two, f))
		if err != nil {
			t.Fatalf("eval --nproc 2 did not write %s: %v", f, err)
		}
		if strings.HasSuffix(f, ".jsonl") {
			a, b = withoutLatency(t, a), withoutLatency(t, b)
		}
		if string(a) != string(b) {
			t.Errorf("%s differs between one process and two ranks:\n one: %s\n two: %s", f, a, b)
		}
	}

	bad := exec.Command(os.Args[0], "train", "--config", "../../recal.toml", "--nproc", "3", "--run-dir", filepath.Join(t.TempDir(), "run"))
	bad.Env = append(os.Environ(), asRecalEnv+"=1")
	out, err = bad.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "train.batch_size = 8 questions do not split into whole groups over 3 ranks") {
		t.Errorf("train --nproc 3 with batch_size 8: %v\n%s\nwant exit 2 naming the batch size and the world size", err, out)
	}
}

// withoutLatency drops the calls' latencies (timings) from JSONL lines.
func withoutLatency(t *testing.T, b []byte) []byte {
	t.Helper()
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var v map[string]any
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Fatal(err)
		}
		if calls, ok := v["calls"].([]any); ok {
			for _, c := range calls {
				delete(c.(map[string]any), "latency_ns")
			}
		}
		s, _ := json.Marshal(v)
		out = append(out, string(s))
	}
	return []byte(strings.Join(out, "\n"))
}
