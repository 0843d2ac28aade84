package trainer

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/recal-project/recal/calibration"
	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/router"
)

// State is what a checkpoint holds beside the weights and the optimizer.
type State struct {
	Step    int                `json:"step"`
	SFTDone bool               `json:"sft_done"`
	Sampler data.SamplerState  `json:"sampler"`
	Balance *router.Balance    `json:"balance"` // EMA routing counts
	Config  string             `json:"config_sha,omitempty"`
	Extra   map[string]float64 `json:"extra,omitempty"`

	// SkippedUpdates counts the optimizer updates skipped for a non-finite
	// gradient norm over the run; ConsecutiveSkips those since the last
	// applied update (train.max_skipped_updates bounds it).
	SkippedUpdates   int `json:"skipped_updates,omitempty"`
	ConsecutiveSkips int `json:"consecutive_skipped_updates,omitempty"`
}

// runDir is an open training run folder:
//
//	config.toml         the resolved configuration (every key; no secrets)
//	metrics.jsonl       one line per GRPO step
//	rollouts.jsonl      one line per response
//	validation.jsonl    one line per validation
//	sft.jsonl           one line per supervised step
//	checkpoints/step-N  Hugging Face folder + optimizer.safetensors + trainer_state.json
//	checkpoints/last    a symbolic link to the newest step-N
type runDir struct {
	dir                     string
	last                    string // newest complete checkpoint ("" if none)
	metrics, rollouts, vals *os.File
	sft                     *os.File
}

func openRun(dir string, cfg config.Config, resume bool) (*runDir, error) {
	if dir == "" {
		return nil, fmt.Errorf("trainer: no run folder")
	}
	r := &runDir{dir: dir}
	ck := filepath.Join(dir, "checkpoints")
	if resume {
		if target, err := os.Readlink(filepath.Join(ck, "last")); err == nil {
			r.last = filepath.Join(ck, target)
		} else if !os.IsNotExist(err) {
			return nil, fmt.Errorf("trainer: %w", err)
		}
		if r.last != "" && !exists(filepath.Join(r.last, "trainer_state.json")) {
			return nil, fmt.Errorf("trainer: %s: incomplete checkpoint (no trainer_state.json)", r.last)
		}
	} else if exists(filepath.Join(dir, "metrics.jsonl")) || exists(ck) {
		return nil, fmt.Errorf("trainer: run folder %s already holds a run; use --resume to continue it or choose another --run-dir", dir)
	}
	if err := os.MkdirAll(ck, 0o755); err != nil {
		return nil, fmt.Errorf("trainer: %w", err)
	}
	// Leftovers of a checkpoint write that was killed midway.
	if leftovers, _ := filepath.Glob(filepath.Join(ck, "*.partial")); len(leftovers) > 0 {
		for _, l := range leftovers {
			os.RemoveAll(l)
		}
	}
	if err := cfg.Write(filepath.Join(dir, "config.toml")); err != nil {
		return nil, err
	}
	step := -1 // keep nothing logged after the checkpoint we resume from
	if r.last != "" {
		var st State
		if err := readJSON(filepath.Join(r.last, "trainer_state.json"), &st); err != nil {
			return nil, err
		}
		step = st.Step
	}
	var err error
	for _, f := range []struct {
		name string
		dst  **os.File
	}{{"metrics.jsonl", &r.metrics}, {"rollouts.jsonl", &r.rollouts}, {"validation.jsonl", &r.vals}, {"sft.jsonl", &r.sft}} {
		path := filepath.Join(dir, f.name)
		if resume {
			if err = truncateLog(path, step, r.last != ""); err != nil {
				r.Close()
				return nil, err
			}
		}
		if *f.dst, err = os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err != nil {
			r.Close()
			return nil, fmt.Errorf("trainer: %w", err)
		}
	}
	return r, nil
}

func (r *runDir) Close() error {
	for _, f := range []*os.File{r.metrics, r.rollouts, r.vals, r.sft} {
		if f != nil {
			f.Close()
		}
	}
	return nil
}

// truncateLog keeps the complete lines of a JSONL log whose "step" is at most
// keep (keep < 0 keeps no GRPO line) and, when keepSFT, the supervised
// stage's lines; a torn last line is dropped. A resumed run thus appends
// exactly where its checkpoint stands.
func truncateLog(path string, keep int, keepSFT bool) error {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	var out bytes.Buffer
	for _, line := range bytes.SplitAfter(b, []byte("\n")) {
		if len(line) == 0 || line[len(line)-1] != '\n' {
			continue // torn by a kill
		}
		var v struct {
			Step  *int   `json:"step"`
			Stage string `json:"stage"`
		}
		if json.Unmarshal(line, &v) != nil || v.Step == nil {
			continue
		}
		if (v.Stage == "sft" && keepSFT) || (v.Stage != "sft" && *v.Step <= keep) {
			out.Write(line)
		}
	}
	return hfmodel.WriteAtomic(path, func(w io.Writer) error {
		_, err := w.Write(out.Bytes())
		return err
	})
}

func writeJSONLine(f *os.File, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	return nil
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("trainer: %s: %w", path, err)
	}
	return nil
}

// checkpoint writes checkpoints/<name> (step-N when name is ""): the policy
// in Hugging Face format, the optimizer state and the trainer state. It is
// written under a .partial name and renamed when complete, then
// checkpoints/last is pointed at it (a symlink replaced atomically).
func (r *runDir) checkpoint(eng *Engine, st *State, sampler *data.Sampler, name string) error {
	if name == "" {
		name = fmt.Sprintf("step-%d", st.Step)
	}
	ck := filepath.Join(r.dir, "checkpoints")
	final := filepath.Join(ck, name)
	partial := final + ".partial"
	os.RemoveAll(partial)
	if err := eng.Policy.Save(partial); err != nil {
		return err
	}
	if err := eng.Policy.SaveOptimizer(filepath.Join(partial, "optimizer.safetensors")); err != nil {
		return err
	}
	st.Sampler = sampler.State()
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	err = hfmodel.WriteAtomic(filepath.Join(partial, "trainer_state.json"), func(w io.Writer) error {
		_, err := w.Write(b)
		return err
	})
	if err != nil {
		return err
	}
	os.RemoveAll(final)
	if err := os.Rename(partial, final); err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	tmp := filepath.Join(ck, ".last.tmp")
	os.Remove(tmp)
	if err := os.Symlink(name, tmp); err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(ck, "last")); err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	r.last = final
	for _, f := range []*os.File{r.metrics, r.rollouts, r.vals, r.sft} {
		f.Sync()
	}
	return nil
}

// loadState restores the optimizer and trainer state of a checkpoint (the
// weights were loaded with the policy).
func loadState(dir string, p interface{ LoadOptimizer(string) error }, st *State, sampler *data.Sampler) error {
	if err := readJSON(filepath.Join(dir, "trainer_state.json"), st); err != nil {
		return err
	}
	if err := p.LoadOptimizer(filepath.Join(dir, "optimizer.safetensors")); err != nil {
		return err
	}
	if st.Balance == nil || st.Balance.Counts == nil {
		return fmt.Errorf("trainer: %s: trainer_state.json has no balance counts", dir)
	}
	return sampler.Restore(st.Sampler)
}

// rolloutLine is one line of rollouts.jsonl: what a response did and the
// exact advantage its tokens were trained with.
type rolloutLine struct {
	Step       int                `json:"step"`
	Dataset    string             `json:"dataset"`
	Group      int                `json:"group"`
	Sample     int                `json:"sample"`
	QuestionID string             `json:"question_id"`
	Question   string             `json:"question"`
	Golden     []string           `json:"golden_answers"`
	RewardsRaw map[string]float64 `json:"rewards_raw"`
	EM         float64            `json:"em"`
	Advantage  float64            `json:"advantage"`
	Response   string             `json:"response"`
	Calls      []router.Call      `json:"calls"`
	End        string             `json:"end"`
	Tokens     int                `json:"policy_tokens"`
}

func (r *runDir) logStep(m Metrics, qs []data.Example, g int, samples []router.Sample, rewards []router.Rewards, cal calibration.Result) error {
	var buf bytes.Buffer
	for i, s := range samples {
		q := qs[i/g]
		raw := map[string]float64{}
		for _, c := range router.Components {
			raw[c] = rewards[i].Get(c)
		}
		n := 0
		for _, v := range s.Mask {
			n += int(v)
		}
		b, err := json.Marshal(rolloutLine{Step: m.Step, Dataset: q.Dataset, Group: i / g, Sample: i % g, QuestionID: q.ID,
			Question: q.Question, Golden: q.Golden, RewardsRaw: raw, EM: rewards[i].EM, Advantage: cal.Advantages[i],
			Response: strings.ToValidUTF8(s.Text, "\uFFFD"), Calls: s.Calls, End: s.End, Tokens: n})
		if err != nil {
			return fmt.Errorf("trainer: %w", err)
		}
		buf.Write(append(b, '\n'))
	}
	if _, err := r.rollouts.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	return writeJSONLine(r.metrics, m)
}

func (r *runDir) logValidation(v ValidationResult) error { return writeJSONLine(r.vals, v) }

// readLines decodes every complete line of a JSONL file into T.
func readLines[T any](path string) ([]T, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trainer: %w", err)
	}
	defer f.Close()
	var out []T
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			continue
		}
		out = append(out, v)
	}
	return out, sc.Err()
}
