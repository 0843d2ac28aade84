package calibration

import (
	"math"
	"strings"
	"testing"
)

func TestDefaultConfig(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatalf("DefaultConfig().Validate() = %v, want nil: the defaults must always load", err)
	}
	if !c.Gating || !c.ComponentAdvantages || !c.VarianceReweighting || !c.DatasetNormalization {
		t.Errorf("DefaultConfig switches = %+v, want all four on (full ReCal)", c)
	}
	if c.TauMin != 0.8 || c.TauMax != 1.25 || c.Epsilon != 1e-6 || c.GateThreshold != 0 {
		t.Errorf("DefaultConfig τ=[%g, %g] ε=%g δ=%g, want the paper's [0.8, 1.25], ε 1e-6, δ 0",
			c.TauMin, c.TauMax, c.Epsilon, c.GateThreshold)
	}
	if got, want := strings.Join(c.Gated, ","), "info,format,route,balance,cost"; got != want {
		t.Errorf("DefaultConfig().Gated = %s, want %s (every auxiliary component, cost included: a cheap wrong answer must earn nothing)", got, want)
	}
	if got, want := c.Weights.Vector(), [NumComponents]float64{1, 0.5, 0.5, 0.25, 0.25, 0}; got != want {
		t.Errorf("DefaultConfig weights = %v, want %v (documented on DefaultWeights; cost 0 keeps the paper's five-component advantages)", got, want)
	}
	// DefaultConfig returns a fresh slice: editing one config must not change the next.
	c.Gated[0] = "route"
	if DefaultConfig().Gated[0] != "info" {
		t.Error("DefaultConfig shares its Gated slice between calls")
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		want []string // substrings of the error; none means valid
	}{
		{"default", func(*Config) {}, nil},
		{"all switches off", func(c *Config) { *c = Config{Weights: c.Weights, TauMin: 1, TauMax: 1, Epsilon: 1e-6} }, nil},
		{"empty gated", func(c *Config) { c.Gated = nil }, nil},
		{"tau equal", func(c *Config) { c.TauMin, c.TauMax = 1, 1 }, nil},
		{"one weight", func(c *Config) { c.Weights = Weights{Route: 2} }, nil},
		{"tau_min > tau_max", func(c *Config) { c.TauMin = 1.5 },
			[]string{"calibration.tau_min (1.5) > calibration.tau_max (1.25)"}},
		{"negative tau_min", func(c *Config) { c.TauMin = -0.1 }, []string{"calibration.tau_min (-0.1)"}},
		{"NaN tau_max", func(c *Config) { c.TauMax = math.NaN() }, []string{"calibration.tau_max (NaN)"}},
		{"weights all zero", func(c *Config) { c.Weights = Weights{} }, []string{"calibration.weights: all zero"}},
		{"negative weight", func(c *Config) { c.Weights.Balance = -0.25 }, []string{"calibration.weights.balance (-0.25)"}},
		{"infinite weight", func(c *Config) { c.Weights.Ans = math.Inf(1) }, []string{"calibration.weights.ans (+Inf)"}},
		{"unknown gated", func(c *Config) { c.Gated = []string{"info", "speed"} },
			[]string{`calibration.gated: unknown component "speed"`}},
		{"ans gated", func(c *Config) { c.Gated = []string{"ans"} }, []string{`calibration.gated: "ans" is never gated`}},
		{"duplicate gated", func(c *Config) { c.Gated = []string{"info", "info"} }, []string{`"info" listed twice`}},
		{"epsilon zero", func(c *Config) { c.Epsilon = 0 }, []string{"calibration.epsilon (0)"}},
		{"epsilon negative", func(c *Config) { c.Epsilon = -1e-6 }, []string{"calibration.epsilon (-1e-06)"}},
		{"NaN gate_threshold", func(c *Config) { c.GateThreshold = math.NaN() }, []string{"calibration.gate_threshold (NaN)"}},
		{"several at once", func(c *Config) { c.Epsilon = 0; c.TauMin = 2 },
			[]string{"calibration.epsilon", "calibration.tau_min (2) > calibration.tau_max (1.25)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.edit(&c)
			err := c.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want an error naming %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %q, want it to contain %q so the user finds the bad key", err, w)
				}
			}
			if !strings.HasPrefix(err.Error(), "calibration: ") {
				t.Errorf("Validate() = %q, want the package prefix", err)
			}
			if _, cerr := Calibrate(c, []Response{{Raw: [NumComponents]float64{1}}}); cerr == nil {
				t.Error("Calibrate accepted an invalid config; it must validate first")
			}
		})
	}
}

func TestComponentIndex(t *testing.T) {
	for want, name := range Components {
		if got, ok := ComponentIndex(name); !ok || got != want {
			t.Errorf("ComponentIndex(%q) = %d, %v, want %d, true", name, got, ok, want)
		}
	}
	if _, ok := ComponentIndex("speed"); ok {
		t.Error(`ComponentIndex("speed") found a component that does not exist`)
	}
	if Components[Ans] != "ans" || Components[Info] != "info" || Components[Format] != "format" ||
		Components[Route] != "route" || Components[Balance] != "balance" {
		t.Errorf("index constants disagree with Components %v", Components)
	}
}
