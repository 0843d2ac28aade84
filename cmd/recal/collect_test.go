package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// collect, then fit, from the command line: the matrix is written and
// resumed, the routers land in one folder each, and the errors name what
// to run.
func TestCollectAndFit(t *testing.T) {
	out := filepath.Join(t.TempDir(), "outcomes")
	routers := filepath.Join(t.TempDir(), "routers")
	fast := []string{"--set", "baselines.mlp.epochs=1", "--set", "baselines.routellm_mf.epochs=1", "--set", "baselines.routerdc.epochs=1",
		"--set", "baselines.graphrouter.steps=2", "--set", "embedding.dim=256"}
	cases := []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{"fit before collect", append([]string{"fit", "--config", "../../recal.toml", "--outcomes", out, "--router-dir", routers}, fast...), 1, "",
			"recal collect --config recal.toml --out " + out},
		{"collect", []string{"collect", "--config", "../../recal.toml", "--out", out, "--per-dataset", "12"}, 0, "24 questions × 3 models", ""},
		{"collect again resumes", []string{"collect", "--config", "../../recal.toml", "--out", out, "--per-dataset", "12"}, 0, "24 questions", "resuming"},
		{"collect another pool", []string{"collect", "--config", "../../recal.toml", "--out", out, "--set", "pool.max_query_chars=100"}, 1, "",
			"outcomes of another pool"},
		{"fit an unknown router", []string{"fit", "--config", "../../recal.toml", "--outcomes", out, "--router-dir", routers, "--routers", "oracle"}, 2, "",
			"known: graphrouter, mlp, routellm-mf, routerdc"},
		{"fit", append([]string{"fit", "--config", "../../recal.toml", "--outcomes", out, "--router-dir", routers}, fast...), 0, "routerdc", ""},
		{"fit without --router-dir", []string{"fit", "--config", "../../recal.toml", "--outcomes", out}, 2, "", "--router-dir is required"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, append([]string{"--threads", "2"}, c.args...)...)
			if code != c.code {
				t.Fatalf("exit status %d, want %d; stderr: %s", code, c.code, stderr)
			}
			if !strings.Contains(stdout, c.stdout) || !strings.Contains(stderr, c.stderr) {
				t.Errorf("stdout %q, stderr %q: want %q and %q in them", stdout, stderr, c.stdout, c.stderr)
			}
		})
	}
	for _, name := range []string{"mlp", "routellm-mf", "routerdc", "graphrouter"} {
		if _, err := os.Stat(filepath.Join(routers, name, "manifest.json")); err != nil {
			t.Errorf("router %s not fitted: %v", name, err)
		}
	}
}
