package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/recal-project/recal/internal/inputfile"
)

// A training run keeps its configuration in its folder (config.toml, and
// config-K.toml when a resume changed it at step K). This file reads such a
// file back and says which keys of another configuration differ from it,
// and which keys a resume may change at all (OperationalKeys). The trainer
// decides with it whether `recal train --resume` continues a run.

// OperationalKeys are the configuration keys a resumed run may change
// freely: they say where and how fast the computation runs, how far it goes,
// what is logged and when, or what only evaluation reads, not what any step
// computes.
// "[*]" stands for any pool model and a final ".*" for a whole table. Every
// other key ([train], [sft], [calibration], [router], the training data,
// the pool's models and their behaviour, policy.checkpoint and policy.dtype)
// must match the run's unless the resume allows a change (see
// trainer.Options.AllowConfigChange).
var OperationalKeys = []string{
	"policy.device", "policy.threads", "policy.rollout_workers",
	"policy.gradient_checkpointing", // memory: the same gradients, recomputed
	"policy.device_memory",          // read by the dry run's memory plan only
	"train.steps",                   // where training stops: a longer run continues a shorter one (not with a decaying train.lr_schedule: see ChangesFrom)
	"train.log_every", "train.checkpoint_every", "train.validate_every", "train.max_skipped_updates",
	"train.micro_batch", "train.head_chunk", // memory knobs: the same sums, grouped differently
	"train.rollout_rows", // memory: the same responses, decoded in rounds
	"eval.*", "serve.*",
	"dist.*",                     // how ranks talk; the world size is not a key either: a resume may change it
	"embedding.*", "baselines.*", // read by the baseline routers only
	"data.test", "data.test_per_dataset", // read by evaluation only
	"pool.cache", "pool.cache_dir", "pool.max_concurrency",
	"pool.models[*].openai.api_key_env", "pool.models[*].openai.timeout", "pool.models[*].openai.max_concurrency",
	"pool.models[*].openai.requests_per_minute", "pool.models[*].openai.max_retries",
	"pool.models[*].openai.retry_base", "pool.models[*].openai.retry_max",
	"pool.models[*].sim.latency",
}

// Change is one key whose value differs from the run's; Old or New is
// null when the key is absent on that side (a pool model added or removed).
type Change struct {
	Key string          `json:"key"`
	Old json.RawMessage `json:"old"`
	New json.RawMessage `json:"new"`
}

// ReadRunFile parses a run's configuration file. A key the file lacks
// (written before the key existed) holds its default, the behaviour the run
// had, with one exception: a PPO run written before ppo.kl_coef existed
// weighed its in-reward KL by train.kl_coef, so its ppo.kl_coef is that.
func ReadRunFile(path string) (Config, error) {
	text, err := inputfile.ReadFile(path, inputfile.ConfigLimit) // as Load reads one
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	cfg, err := Parse(path, text, nil) // its errors name path
	if err != nil {
		return Config{}, err
	}
	if cfg.Train.Algorithm == "ppo" {
		var keys struct {
			PPO map[string]any `toml:"ppo"`
		}
		if _, err := toml.Decode(string(text), &keys); err != nil {
			return Config{}, fmt.Errorf("config: %s: %w", path, err)
		}
		if _, ok := keys.PPO["kl_coef"]; !ok {
			cfg.PPO.KLCoef = cfg.Train.KLCoef
		}
	}
	return cfg, nil
}

// ChangesFrom compares c with the configuration file of a run (as Write
// wrote it) and returns the keys that differ, except
// the operational ones; train.steps counts as a training key when either
// side's train.lr_schedule decays over it. A key the run's file lacks holds
// the value the run had (ReadRunFile).
func (c Config) ChangesFrom(path string) ([]Change, error) {
	old, err := ReadRunFile(path)
	if err != nil {
		return nil, err
	}
	a, err := flatConfig(old)
	if err != nil {
		return nil, err
	}
	b, err := flatConfig(c)
	if err != nil {
		return nil, err
	}
	var out []Change
	for key, v := range a {
		if w, ok := b[key]; !ok || w.value != v.value {
			if !operational(v.pattern) {
				out = append(out, Change{Key: key, Old: json.RawMessage(v.value), New: rawOrNull(w.value, ok)})
			}
		}
	}
	for key, w := range b {
		if _, ok := a[key]; !ok && !operational(w.pattern) {
			out = append(out, Change{Key: key, Old: json.RawMessage("null"), New: json.RawMessage(w.value)})
		}
	}
	// A decaying learning-rate schedule spans train.steps: another step
	// count changes the learning rate of every step to come.
	if old.Train.Steps != c.Train.Steps && (old.Train.LRSchedule != "constant" || c.Train.LRSchedule != "constant") {
		out = append(out, Change{Key: "train.steps", Old: json.RawMessage(jsonText(old.Train.Steps)), New: json.RawMessage(jsonText(c.Train.Steps))})
	}
	slices.SortFunc(out, func(x, y Change) int { return strings.Compare(x.Key, y.Key) })
	return out, nil
}

func rawOrNull(v string, ok bool) json.RawMessage {
	if !ok {
		return json.RawMessage("null")
	}
	return json.RawMessage(v)
}

// OperationalKey reports whether a resumed run may change the key with this
// pattern (dotted, "[*]" for any pool model, as in OperationalKeys) without
// --allow-config-change. train.steps is one, except while a decaying
// train.lr_schedule spans it (see ChangesFrom).
func OperationalKey(pattern string) bool { return operational(pattern) }

func operational(pattern string) bool {
	for _, k := range OperationalKeys {
		if table, ok := strings.CutSuffix(k, ".*"); ok {
			if strings.HasPrefix(pattern, table+".") {
				return true
			}
		} else if pattern == k {
			return true
		}
	}
	return false
}

// leaf is a key's value as JSON and its pattern (pool model names as [*]).
type leaf struct{ pattern, value string }

// flatConfig maps every key of cfg to its value: "train.lr",
// "pool.models[sim-small].sim.latency", and "pool.models" for the order of
// the models (the order the policy sees them in).
func flatConfig(cfg Config) (map[string]leaf, error) {
	tree, err := cfg.tree()
	if err != nil {
		return nil, err
	}
	out := map[string]leaf{}
	flatten(out, "", "", tree)
	return out, nil
}

// tree is c as Write encodes it, decoded into nested maps: what Diff and
// ChangesFrom compare.
func (c Config) tree() (map[string]any, error) {
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(c); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	m := map[string]any{}
	if _, err := toml.Decode(buf.String(), &m); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return m, nil
}

func flatten(out map[string]leaf, key, pattern string, v any) {
	join := func(a, b string) string {
		if a == "" {
			return b
		}
		return a + "." + b
	}
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			flatten(out, join(key, k), join(pattern, k), x)
		}
	case []map[string]any: // an array of tables, keyed by name
		var names []string
		for i, t := range v {
			name, _ := t["name"].(string)
			if name == "" {
				name = strconv.Itoa(i)
			}
			names = append(names, name)
			flatten(out, key+"["+name+"]", pattern+"[*]", t)
		}
		out[key] = leaf{pattern, jsonText(names)}
	default:
		out[key] = leaf{pattern, jsonText(v)}
	}
}

func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return strconv.Quote(fmt.Sprint(v))
	}
	return string(b)
}
