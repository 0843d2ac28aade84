package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

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
	if err := hfmodel.WriteChecksums(ck); err != nil { // as recal would have written it
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

// probeEnv makes a rank that recal --nproc started (the test binary as
// recal) append to the file it names whether something serves its
// rendezvous address as it starts, then end.
const probeEnv = "RECAL_TEST_PROBE_RENDEZVOUS"

func probeRendezvous(file string) {
	addr := net.JoinHostPort(os.Getenv("MASTER_ADDR"), os.Getenv("MASTER_PORT"))
	state := "served"
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		state = "not served (" + err.Error() + ")"
	} else {
		c.Close()
	}
	f, err := os.OpenFile(file, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "rank %s: %s %s, agent store %q\n", os.Getenv("RANK"), addr, state, os.Getenv("TORCHELASTIC_USE_AGENT_STORE"))
}

// recal --nproc serves the rendezvous store itself, as torchrun's agent
// does, on a port the kernel picked: it is served from before any rank
// starts, so no other process can take the port between its choice and
// the rendezvous (as it could when rank 0 bound a port the launcher had
// found free and released). TestNprocEval runs a job through it.
func TestNprocServesTheRendezvous(t *testing.T) {
	probe := filepath.Join(t.TempDir(), "probe")
	cmd := exec.Command(os.Args[0], "train", "--config", "../../recal.toml", "--nproc", "2", "--run-dir", filepath.Join(t.TempDir(), "run"))
	cmd.Env = append(os.Environ(), asRecalEnv+"=1", probeEnv+"="+probe)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("train --nproc 2 with probing ranks: %v\n%s", err, out)
	}
	b, err := os.ReadFile(probe)
	if err != nil {
		t.Fatalf("no rank probed its rendezvous address: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d ranks probed, want 2:\n%s", len(lines), b)
	}
	for _, l := range lines {
		if !strings.Contains(l, " served, agent store \"True\"") {
			t.Errorf("%s\nwant the rendezvous address served by the launcher before the rank starts, and the rank told to join it as a client", l)
		}
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
