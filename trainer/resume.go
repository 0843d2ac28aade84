package trainer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/recal-project/recal/config"
)

// OperationalKeys are the configuration keys a resumed run may change
// freely: they say where and how fast the computation runs, how far it goes,
// what is logged and when, or what only evaluation reads, not what any step
// computes.
// "[*]" stands for any pool model and a final ".*" for a whole table. Every
// other key ([train], [sft], [calibration], [router], the training data,
// the pool's models and their behaviour, policy.checkpoint and policy.dtype)
// must match the run's unless the resume allows a change (see
// Options.AllowConfigChange).
var OperationalKeys = []string{
	"policy.device", "policy.threads", "policy.rollout_workers",
	"policy.gradient_checkpointing", // memory: the same gradients, recomputed
	"policy.device_memory",          // read by the dry run's memory plan only
	"train.steps",                   // where training stops: a longer run continues a shorter one (not with a decaying train.lr_schedule: see configChanges)
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

// ConfigChange is one key whose value differs from the run's; Old or New is
// null when the key is absent on that side (a pool model added or removed).
type ConfigChange struct {
	Key string          `json:"key"`
	Old json.RawMessage `json:"old"`
	New json.RawMessage `json:"new"`
}

// ConfigMismatchError refuses a resume whose configuration would change what
// the run computes.
type ConfigMismatchError struct {
	File    string         // the run's configuration it was compared with
	Step    int            // the step the new values would take effect at
	Changes []ConfigChange // sorted by key
}

func (e *ConfigMismatchError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "trainer: resume: the configuration differs from the run's (%s) in %d key(s) that change what training computes:", e.File, len(e.Changes))
	for _, c := range e.Changes {
		fmt.Fprintf(&b, "\n  %s: %s in the run, %s now", c.Key, c.Old, c.New)
	}
	fmt.Fprintf(&b, "\nrestore them, or allow the change (--allow-config-change): it takes effect at step %d and is recorded in config-changes.jsonl", e.Step)
	return b.String()
}

// configChangeEvent is one line of config-changes.jsonl.
type configChangeEvent struct {
	Step    int            `json:"step"` // the first GRPO step computed with the new values (config-<step>.toml)
	From    string         `json:"resumed_from,omitempty"`
	Changes []ConfigChange `json:"changes"`
}

var stepConfig = regexp.MustCompile(`^config-(\d+)\.toml$`)

// runConfig returns the configuration file of a run that applies at step:
// config-K.toml with the largest K ≤ step (written when a resume changed the
// configuration at step K), else config.toml; "" when the run has none.
func runConfig(dir string, step int) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("trainer: %w", err)
	}
	best, path := -1, ""
	for _, e := range entries {
		if m := stepConfig.FindStringSubmatch(e.Name()); m != nil {
			if k, err := strconv.Atoi(m[1]); err == nil && k <= step && k > best {
				best, path = k, filepath.Join(dir, e.Name())
			}
		}
	}
	if path == "" && exists(filepath.Join(dir, "config.toml")) {
		path = filepath.Join(dir, "config.toml")
	}
	return path, nil
}

// CheckResume reports whether `recal train --resume` would continue the run
// in dir with cfg, without --allow-config-change: nil when it would (dir
// holds no run configuration, or one whose keys match cfg's but for
// OperationalKeys), a *ConfigMismatchError naming the training keys that
// differ, or the error that resume would stop with. It writes nothing.
// Commands that reuse or continue a run (recal table1, recal ablate) check
// with it, so that they accept exactly what train --resume accepts.
func CheckResume(dir string, cfg config.Config) error {
	_, err := inspectRun(dir, cfg, true, false)
	return err
}

// RunConfig returns the configuration the run in dir trained its latest
// steps with (config-K.toml of the largest K, else config.toml; see
// runConfig) and its path; "" and cfg's zero value when the run has none.
// Keys it lacks hold their defaults (see readRunConfig).
func RunConfig(dir string) (config.Config, string, error) {
	path, err := runConfig(dir, math.MaxInt)
	if err != nil || path == "" {
		return config.Config{}, "", err
	}
	cfg, err := readRunConfig(path)
	return cfg, path, err
}

// readRunConfig parses a run's configuration file. A key the file lacks
// (written before the key existed) holds its default, the behaviour the run
// had, with one exception: a PPO run written before ppo.kl_coef existed
// weighed its in-reward KL by train.kl_coef, so its ppo.kl_coef is that.
func readRunConfig(path string) (config.Config, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return config.Config{}, fmt.Errorf("trainer: %w", err)
	}
	cfg, err := config.Parse(path, text, nil)
	if err != nil {
		return config.Config{}, fmt.Errorf("trainer: the run's configuration: %w", err)
	}
	if cfg.Train.Algorithm == "ppo" {
		var keys struct {
			PPO map[string]any `toml:"ppo"`
		}
		if _, err := toml.Decode(string(text), &keys); err != nil {
			return config.Config{}, fmt.Errorf("trainer: %s: %w", path, err)
		}
		if _, ok := keys.PPO["kl_coef"]; !ok {
			cfg.PPO.KLCoef = cfg.Train.KLCoef
		}
	}
	return cfg, nil
}

// configChanges compares cfg with the configuration file of a run (as
// config.Config.Write wrote it) and returns the keys that differ, except
// the operational ones; train.steps counts as a training key when either
// side's train.lr_schedule decays over it. A key the run's file lacks holds
// the value the run had (readRunConfig).
func configChanges(path string, cfg config.Config) ([]ConfigChange, error) {
	old, err := readRunConfig(path)
	if err != nil {
		return nil, err
	}
	a, err := flatConfig(old)
	if err != nil {
		return nil, err
	}
	b, err := flatConfig(cfg)
	if err != nil {
		return nil, err
	}
	var out []ConfigChange
	for key, v := range a {
		if w, ok := b[key]; !ok || w.value != v.value {
			if !operational(v.pattern) {
				out = append(out, ConfigChange{Key: key, Old: json.RawMessage(v.value), New: rawOrNull(w.value, ok)})
			}
		}
	}
	for key, w := range b {
		if _, ok := a[key]; !ok && !operational(w.pattern) {
			out = append(out, ConfigChange{Key: key, Old: json.RawMessage("null"), New: json.RawMessage(w.value)})
		}
	}
	// A decaying learning-rate schedule spans train.steps: another step
	// count changes the learning rate of every step to come.
	if old.Train.Steps != cfg.Train.Steps && (old.Train.LRSchedule != "constant" || cfg.Train.LRSchedule != "constant") {
		out = append(out, ConfigChange{Key: "train.steps", Old: json.RawMessage(jsonText(old.Train.Steps)), New: json.RawMessage(jsonText(cfg.Train.Steps))})
	}
	slices.SortFunc(out, func(x, y ConfigChange) int { return strings.Compare(x.Key, y.Key) })
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
// train.lr_schedule spans it (see configChanges).
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
func flatConfig(cfg config.Config) (map[string]leaf, error) {
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(cfg); err != nil {
		return nil, fmt.Errorf("trainer: %w", err)
	}
	tree := map[string]any{}
	if _, err := toml.Decode(buf.String(), &tree); err != nil {
		return nil, fmt.Errorf("trainer: %w", err)
	}
	out := map[string]leaf{}
	flatten(out, "", "", tree)
	return out, nil
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
