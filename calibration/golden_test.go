package calibration

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// update regenerates testdata: golden.json by running the Python reference
// (reference.py generate), and the synthetic run dir testdata/run from Go.
var update = flag.Bool("update", false, "regenerate testdata/golden.json (with reference.py) and testdata/run")

// python finds a Python 3.11+ (tomllib) for the reference script, or skips.
func python(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if path, err := exec.LookPath(p); err == nil {
			if exec.Command(path, "-c", "import tomllib").Run() == nil {
				return path
			}
		}
	}
	t.Skip("no python3 with tomllib (3.11+): cannot run testdata/reference.py")
	return ""
}

type goldenFile struct {
	Cases []struct {
		Name   string          `json:"name"`
		Seed   int             `json:"seed"`
		Config json.RawMessage `json:"config"`
		Batch  []struct {
			Group   int                `json:"group"`
			Dataset string             `json:"dataset"`
			Raw     map[string]float64 `json:"raw"`
		} `json:"batch"`
		Advantages []float64 `json:"advantages"`
		Tau        []float64 `json:"tau"`
	} `json:"cases"`
}

// configFromJSON decodes a [calibration] table written as JSON (the toml key
// names) over DefaultConfig, as reference.py does.
func configFromJSON(raw json.RawMessage) (Config, error) {
	cfg := DefaultConfig()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// rawFromMap reads the components of a JSON rewards object.
func rawFromMap(m map[string]float64) ([NumComponents]float64, error) {
	var raw [NumComponents]float64
	for i, c := range Components {
		x, ok := m[c]
		if !ok {
			return raw, fmt.Errorf("missing component %q", c)
		}
		raw[i] = x
	}
	return raw, nil
}

// TestGolden compares Calibrate with the independent Python reference on
// random batches under several configs (testdata/golden.json, made by
// reference.py generate). Both sum in the same order, so they agree to the
// last bits; 1e-9 leaves room for nothing but rounding.
func TestGolden(t *testing.T) {
	path := filepath.Join("testdata", "golden.json")
	if *update {
		py := python(t)
		if out, err := exec.Command(py, filepath.Join("testdata", "reference.py"), "generate", path).CombinedOutput(); err != nil {
			t.Fatalf("reference.py generate: %v\n%s", err, out)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var golden goldenFile
	if err := json.Unmarshal(b, &golden); err != nil {
		t.Fatal(err)
	}
	if len(golden.Cases) < 6 {
		t.Fatalf("golden.json has %d cases, want at least 6", len(golden.Cases))
	}
	// The cost component must be checked in every setting of the four
	// switches, weighted (and gated, where gating is on).
	covered := map[[4]bool]bool{}
	for _, c := range golden.Cases {
		cfg, err := configFromJSON(c.Config)
		if err != nil {
			t.Fatalf("case %s: config %s: %v", c.Name, c.Config, err)
		}
		if cfg.Weights.Cost > 0 && cfg.gatedMask()[Cost] {
			covered[[4]bool{cfg.Gating, cfg.ComponentAdvantages, cfg.VarianceReweighting, cfg.DatasetNormalization}] = true
		}
	}
	if len(covered) != 16 {
		t.Errorf("golden.json weights a gated cost component in %d of the 16 settings of gating, CAE, reweighting and dataset normalisation, want all 16 (reference.py's CASES)", len(covered))
	}
	for _, c := range golden.Cases {
		t.Run(c.Name, func(t *testing.T) {
			cfg, err := configFromJSON(c.Config)
			if err != nil {
				t.Fatalf("config %s: %v", c.Config, err)
			}
			batch := make([]Response, len(c.Batch))
			for j, r := range c.Batch {
				raw, err := rawFromMap(r.Raw)
				if err != nil {
					t.Fatalf("batch[%d]: %v", j, err)
				}
				batch[j] = Response{Group: r.Group, Dataset: r.Dataset, Raw: raw}
			}
			res, err := Calibrate(cfg, batch)
			if err != nil {
				t.Fatal(err)
			}
			assertClose(t, "Advantages (vs reference.py)", res.Advantages, c.Advantages, 1e-9)
			assertClose(t, "Tau (vs reference.py)", res.Tau, c.Tau, 1e-9)
		})
	}
}

// The synthetic run dir testdata/run stands in for a training run's output:
// config.toml with a non-default [calibration] table (runConfig, written out
// by hand in runConfigTOML) and rollouts.jsonl with the advantages Calibrate
// gave, in the trainer's record format.

func runConfig() Config {
	return Config{
		Gating:               true,
		Gated:                []string{"info", "format", "balance", "cost"},
		GateThreshold:        0.2,
		ComponentAdvantages:  true,
		VarianceReweighting:  true,
		TauMin:               0.75,
		TauMax:               1.3,
		DatasetNormalization: true,
		Epsilon:              1e-6,
		Weights:              Weights{Ans: 1, Info: 0.3, Format: 0.2, Route: 0.4, Balance: 0.1, Cost: 0.3},
	}
}

const runConfigTOML = `# Synthetic run config for calibration tests (see testdata/README.md).
[policy]
checkpoint = "runs/init/tiny"
device = "cpu"

[calibration]
gating = true
gated = ["info", "format", "balance", "cost"]
gate_threshold = 0.2
component_advantages = true
variance_reweighting = true
tau_min = 0.75
tau_max = 1.3
dataset_normalization = true
epsilon = 1e-6

[calibration.weights]
ans = 1.0
info = 0.3
format = 0.2
route = 0.4
balance = 0.1
cost = 0.3
`

// rolloutRecord is one line of rollouts.jsonl (the fields reference.py reads).
type rolloutRecord struct {
	Step       int                `json:"step"`
	Dataset    string             `json:"dataset"`
	Group      int                `json:"group"`
	Sample     int                `json:"sample"`
	RewardsRaw map[string]float64 `json:"rewards_raw"`
	Advantage  float64            `json:"advantage"`
}

func writeRun(dir string) error {
	rng := rand.New(rand.NewPCG(2024, 7))
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for step := 1; step <= 3; step++ {
		batch := randomBatch(rng, 4, 4)
		for j := range batch {
			batch[j].Dataset = []string{"nq", "hotpotqa", "2wiki"}[batch[j].Group%3]
		}
		res, err := Calibrate(runConfig(), batch)
		if err != nil {
			return err
		}
		for j, r := range batch {
			raw := map[string]float64{}
			for m, c := range Components {
				raw[c] = r.Raw[m]
			}
			rec := rolloutRecord{Step: step, Dataset: r.Dataset, Group: r.Group, Sample: j % 4, RewardsRaw: raw, Advantage: res.Advantages[j]}
			if err := enc.Encode(rec); err != nil {
				return err
			}
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(runConfigTOML), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "rollouts.jsonl"), buf.Bytes(), 0o644)
}

func readRun(t *testing.T, dir string) map[int][]rolloutRecord {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "rollouts.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	steps := map[int][]rolloutRecord{}
	for i, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var rec rolloutRecord
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("rollouts.jsonl:%d: %v", i+1, err)
		}
		steps[rec.Step] = append(steps[rec.Step], rec)
	}
	return steps
}

// TestReferenceCheckRun checks the synthetic run both ways: Go recomputes
// its logged advantages, and `reference.py check` accepts it and rejects a
// copy with one advantage off by 1e-3 (exit status 1).
func TestReferenceCheckRun(t *testing.T) {
	dir := filepath.Join("testdata", "run")
	if *update {
		if err := writeRun(dir); err != nil {
			t.Fatal(err)
		}
	}
	steps := readRun(t, dir)
	if len(steps) == 0 {
		t.Fatal("testdata/run/rollouts.jsonl has no records")
	}
	for step, recs := range steps {
		batch := make([]Response, len(recs))
		for j, rec := range recs {
			raw, err := rawFromMap(rec.RewardsRaw)
			if err != nil {
				t.Fatalf("step %d record %d: %v", step, j, err)
			}
			batch[j] = Response{Group: rec.Group, Dataset: rec.Dataset, Raw: raw}
		}
		res, err := Calibrate(runConfig(), batch)
		if err != nil {
			t.Fatal(err)
		}
		for j, rec := range recs {
			if math.Abs(res.Advantages[j]-rec.Advantage) > 1e-12 {
				t.Errorf("step %d record %d: logged Â %g, recomputed %g", step, j, rec.Advantage, res.Advantages[j])
			}
		}
	}

	py := python(t)
	script := filepath.Join("testdata", "reference.py")
	if out, err := exec.Command(py, script, "check", dir).CombinedOutput(); err != nil {
		t.Fatalf("reference.py check %s: %v, want exit 0 (the logged advantages are Calibrate's)\n%s", dir, err, out)
	}

	// A corrupted copy must fail with exit status 1.
	bad := t.TempDir()
	cfg, err := os.ReadFile(filepath.Join(dir, "config.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bad, "config.toml"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	first := true
	for step := 1; step <= len(steps); step++ {
		for _, rec := range steps[step] {
			if first {
				rec.Advantage += 1e-3
				first = false
			}
			if err := enc.Encode(rec); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.WriteFile(filepath.Join(bad, "rollouts.jsonl"), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(py, script, "check", bad).CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("reference.py check on a run with one advantage off by 1e-3: %v, want exit status 1\n%s", err, out)
	}
}
