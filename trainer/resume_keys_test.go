package trainer

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/recal-project/recal/config"
)

// configChanges names each training key that differs, pool models by name,
// with both values, and lets the operational keys through.
func TestConfigChanges(t *testing.T) {
	load := func(t *testing.T, sets ...string) config.Config {
		t.Helper()
		cfg, err := config.Load("../recal.toml", sets)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	path := filepath.Join(t.TempDir(), "config.toml")
	run := load(t)
	if err := run.Write(path); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		sets []string
		edit func(c *config.Config)
		want string   // the changes as key=old>new, sorted by key
		has  []string // instead of want: changes that must be among them
	}{
		{"same configuration", nil, nil, "", nil},
		{"operational keys only", []string{"policy.threads=3", "train.steps=999", "train.log_every=1", "train.micro_batch=2",
			"eval.batch=3", "data.test_per_dataset=7", "pool.cache=read-write", "pool.max_concurrency=5"}, nil, "", nil},
		{"a simulated model's latency", nil, func(c *config.Config) { c.Pool.Models[1].Sim.Latency *= 9 }, "", nil},
		{"training keys", []string{"calibration.tau_min=0.7", "train.lr=1e-3", "sft.steps=5", "policy.dtype=bfloat16"}, nil,
			`calibration.tau_min=0.8>0.7 policy.dtype="float32">"bfloat16" sft.steps=600>5 train.lr=0.0003>0.001`, nil},
		{"a simulated model's accuracy", nil, func(c *config.Config) { c.Pool.Models[2].Sim.DefaultAccuracy = 0.5 },
			"pool.models[sim-small].sim.default_accuracy=0.05>0.5", nil},
		{"the order of the models (the policy sees them in it)", nil, func(c *config.Config) {
			c.Pool.Models[0], c.Pool.Models[1] = c.Pool.Models[1], c.Pool.Models[0]
		}, `pool.models=["sim-factoid","sim-multihop","sim-small"]>["sim-multihop","sim-factoid","sim-small"]`, nil},
		{"a model removed", nil, func(c *config.Config) { c.Pool.Models = c.Pool.Models[:2] }, "",
			[]string{`pool.models[sim-small].name="sim-small">null`, `pool.models[sim-small].sim.default_accuracy=0.05>null`, `pool.models=["sim-factoid","sim-multihop","sim-small"]>["sim-factoid","sim-multihop"]`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := load(t, c.sets...)
			if c.edit != nil {
				c.edit(&cfg)
			}
			changes, err := configChanges(path, cfg)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, ch := range changes {
				got = append(got, fmt.Sprintf("%s=%s>%s", ch.Key, ch.Old, ch.New))
			}
			text := strings.Join(got, " ")
			if c.has != nil {
				for _, h := range c.has {
					if !slices.Contains(got, h) {
						t.Errorf("changes %q lack %q", got, h)
					}
				}
				return
			}
			if text != c.want {
				t.Errorf("changes %q, want %q", text, c.want)
			}
		})
	}
}
