package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/torchbridge"
)

func TestMain(m *testing.M) {
	torchbridge.UsePassiveOpenMP()
	torchbridge.UseTrainingMalloc() // set now, so that train commands run in-process do not re-execute the test binary
	if os.Getenv(asRecalEnv) == "1" {
		if f := os.Getenv(probeEnv); f != "" && os.Getenv("RANK") != "" {
			probeRendezvous(f) // a rank of TestNprocServesTheRendezvous: probe, then end
			os.Exit(0)
		}
		// The test binary as recal itself: the ranks of --nproc re-execute it.
		ctx, stop := interruptContext(context.Background(), os.Stderr, os.Exit)
		code := run(ctx, os.Args)
		stop()
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// runCLI runs recal with args and returns its exit status and stderr.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	oldOut, oldErr := os.Stdout, os.Stderr
	ro, wo, _ := os.Pipe()
	re, we, _ := os.Pipe()
	os.Stdout, os.Stderr = wo, we
	outc, errc := make(chan string), make(chan string)
	go func() { b, _ := io.ReadAll(ro); outc <- string(b) }()
	go func() { b, _ := io.ReadAll(re); errc <- string(b) }()
	code := run(context.Background(), append([]string{"recal"}, args...))
	wo.Close()
	we.Close()
	os.Stdout, os.Stderr = oldOut, oldErr
	return code, <-outc, <-errc
}

// smallCheckpoint is a tiny policy with a 64-token context.
func smallCheckpoint(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "ck")
	code, _, stderr := runCLI(t, "--threads", "2", "policy", "init", "--preset", "tiny", "--tokenizer", "../../tokenizer/qwen2.5",
		"--out", dir, "--trim-corpus", "../../router/prompt.tmpl")
	if code != 0 {
		t.Fatalf("policy init: exit %d: %s", code, stderr)
	}
	cfg, err := hfmodel.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxPositionEmbeddings = 64
	b, _ := cfg.MarshalJSON()
	os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644)
	if err := hfmodel.WriteChecksums(dir); err != nil { // as recal would have written it
		t.Fatal(err)
	}
	return dir
}

func TestCLI(t *testing.T) {
	ck := smallCheckpoint(t)
	cases := []struct {
		name    string
		args    []string
		code    int
		stdout  string // substring expected on stdout ("" = not checked)
		stderr  string // substring expected on stderr
		noStout bool
	}{
		{"generate", []string{"generate", "--checkpoint", ck, "--prompt", "Who wrote Hamlet?", "--max-new-tokens", "5", "--temperature", "0.7", "--seed", "3"}, 0, "", "", false},
		{"prompt longer than the context", []string{"generate", "--checkpoint", ck, "--prompt", strings.Repeat("word ", 80)}, 1, "", "context", true},
		{"missing flag", []string{"generate", "--prompt", "x"}, 2, "", "--checkpoint is required", true},
		{"not a checkpoint", []string{"generate", "--checkpoint", t.TempDir(), "--prompt", "x"}, 1, "", "tokenizer", true},
		{"bad top-p", []string{"generate", "--checkpoint", ck, "--prompt", "x", "--top-p", "0"}, 2, "", "--top-p", true},
		{"unknown config key", []string{"train", "--config", "../../recal.toml", "--set", "train.nope=1"}, 2, "", `unknown key "train.nope"`, true},
		{"contradictory config", []string{"train", "--config", "../../recal.toml", "--set", "calibration.tau_min=2"}, 2, "", "tau_min", true},
		// A TOML list reaches the config whole: the flag is not split at its commas.
		{"a list by --set", []string{"train", "--config", "../../recal.toml", "--set", "sft.route=agree", "--set", `sft.chain=["sim-factoid", "sim-nope"]`}, 2, "", `sft.chain[1] = "sim-nope": no such pool model`, true},
		{"allow-config-change without resume", []string{"train", "--config", "../../recal.toml", "--allow-config-change"}, 2, "", "--allow-config-change needs --resume", true},
		{"unknown split", []string{"eval", "--config", "../../recal.toml", "--checkpoint", ck, "--split", "weird"}, 2, "", "weird", true},
		{"val split with nothing held out", []string{"eval", "--config", "../../recal.toml", "--checkpoint", ck, "--split", "val", "--set", "data.val_per_dataset=0"}, 2, "", "data.val_per_dataset is 0", true},
		{"unknown router", []string{"eval", "--config", "../../recal.toml", "--checkpoint", ck, "--routers", "oracle"}, 2, "", "oracle", true},
		{"eval on a folder that is not a policy", []string{"eval", "--config", "../../recal.toml", "--checkpoint", t.TempDir(), "--routers", "random", "--split", "id"}, 1, "", "is not a policy", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, append([]string{"--threads", "2"}, c.args...)...)
			if code != c.code {
				t.Fatalf("exit status %d, want %d; stderr: %s", code, c.code, stderr)
			}
			if !strings.Contains(stderr, c.stderr) {
				t.Errorf("stderr %q does not mention %q", stderr, c.stderr)
			}
			if c.noStout && stdout != "" {
				t.Errorf("stdout %q, want nothing on failure", stdout)
			}
			if c.code == 0 && strings.Contains(stdout, "level=") {
				t.Errorf("logs leaked into stdout: %q", stdout)
			}
		})
	}
}
