package eval

import (
	"fmt"
	"sort"

	"github.com/BurntSushi/toml"

	"github.com/recal-project/recal/internal/inputfile"
	"github.com/recal-project/recal/llmpool"
)

// LoadExtraModels reads a TOML file of [[models]] entries (the keys of
// [[pool.models]]) to add to the pool at evaluation only: models unseen in
// training, shown to the policy by their description (the paper's "Ours+").
func LoadExtraModels(path string) ([]llmpool.ModelConfig, error) {
	var f struct {
		Models []llmpool.ModelConfig `toml:"models"`
	}
	b, err := inputfile.ReadFile(path, inputfile.ConfigLimit)
	if err != nil {
		return nil, fmt.Errorf("eval: %w", err)
	}
	md, err := toml.Decode(string(b), &f)
	if err != nil {
		return nil, fmt.Errorf("eval: %s: %w", path, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		sort.Strings(keys)
		return nil, fmt.Errorf("eval: %s: unknown key %q", path, keys[0])
	}
	if len(f.Models) == 0 {
		return nil, fmt.Errorf("eval: %s: no [[models]] entry", path)
	}
	check := llmpool.Defaults()
	check.Models = f.Models
	check.SetDefaults()
	if err := check.Validate(); err != nil {
		return nil, fmt.Errorf("eval: %s: %w", path, err)
	}
	return f.Models, nil
}
