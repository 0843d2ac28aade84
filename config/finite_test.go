package config

import (
	"strings"
	"testing"
)

func TestParseRefusesNonFinite(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		sets       []string
		want       string
	}{
		{"nan in the file", base + "\n[train]\nlr = nan\n", nil, "train.lr = NaN: must be a finite number"},
		{"nan by set", base, []string{"train.temperature=nan"}, "train.temperature = NaN: must be a finite number"},
		{"inf by set", base, []string{"train.kl_coef=inf"}, "train.kl_coef = +Inf: must be a finite number"},
		{"inf in a list of tables", strings.Replace(base, `provider = "sim"`, "provider = \"sim\"\nprice_in = -inf", 1), nil,
			"pool.models[0].price_in = -Inf: must be a finite number"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse("x.toml", []byte(tc.text), tc.sets)
			if err == nil {
				t.Fatalf("Parse accepted it (%+v); want an error containing %q: NaN passes range checks such as x < 0", cfg.Train, tc.want)
			}
			// The value's source is named: the --set flag that gave it, or
			// the file.
			from := "config: x.toml: "
			if len(tc.sets) > 0 {
				from = "config: --set " + tc.sets[0] + ": "
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), from) {
				t.Fatalf("error %q; want it to start %q and contain %q", err, from, tc.want)
			}
		})
	}
}
