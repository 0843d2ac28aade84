package trainer

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/recal-project/recal/calibration"
	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/atomicfile"
	"github.com/recal-project/recal/internal/rollout"
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

	// PPOCostWindow is train.algorithm "ppo"'s window of the last
	// ppo.cost_window responses' √cost, oldest first (cheapness).
	PPOCostWindow []float64 `json:"ppo_cost_window,omitempty"`
}

// runDir is an open training run folder:
//
//	config.toml          the resolved configuration (every key; no secrets)
//	config-N.toml        the configuration from step N on, when a resume
//	                     allowed a change (config-changes.jsonl says what)
//	config-changes.jsonl one line per allowed change: step and keys
//	metrics.jsonl        one line per GRPO step
//	rollouts.jsonl       one line per response
//	validation.jsonl     one line per validation
//	sft.jsonl            one line per supervised step
//	checkpoints/         step-N/, sft/, last, best and best.json (see checkpoint.go)
type runDir struct {
	dir                     string
	last                    string // newest complete checkpoint ("" if none)
	metrics, rollouts, vals *os.File
	sft                     *os.File
	ops                     fileOps // the checkpoint writer's file operations (nil: directOps)
	// follower marks the run folder as a data-parallel rank other than 0
	// sees it: read, never written (the logs are rank 0's).
	follower bool
}

// runPlan is what Train found in the run folder before writing anything.
type runPlan struct {
	dir     string
	resume  bool
	last    string          // the checkpoint to continue from ("" = the start)
	state   State           // its trainer state
	changes []config.Change // allowed configuration changes to record
	best    bestCheckpoint  // the best validation up to last (train.keep_best; "" Checkpoint: none)
}

// inspectRun reads the run folder and decides, writing nothing: a new run
// needs a folder that holds no run; a resumed one continues from the
// checkpoint checkpoints/last names (none: from the start) with a
// configuration whose training keys match the run's (see config.OperationalKeys),
// unless allowChange.
func inspectRun(dir string, cfg config.Training, resume, allowChange bool) (runPlan, error) {
	p := runPlan{dir: dir, resume: resume}
	if dir == "" {
		return p, fmt.Errorf("trainer: no run folder")
	}
	if cfg.Record == nil {
		return p, fmt.Errorf("trainer: the configuration has no Record to keep in the run folder (build it with config.Config.Training)")
	}
	ck := filepath.Join(dir, "checkpoints")
	if !resume {
		if exists(filepath.Join(dir, "metrics.jsonl")) || exists(ck) {
			return p, fmt.Errorf("trainer: run folder %s already holds a run; use --resume to continue it or choose another --run-dir", dir)
		}
		return p, nil
	}
	if !exists(dir) {
		return p, nil // nothing to continue: a resume starts the run
	}
	var err error
	if p.last, err = lastCheckpoint(ck); err != nil {
		return p, err
	}
	if p.last != "" {
		if err := readJSON(filepath.Join(p.last, "trainer_state.json"), &p.state); err != nil {
			return p, err
		}
	}
	if cfg.Train.KeepBest && p.last != "" {
		if p.best, err = recoverBest(dir, p.state.Step); err != nil {
			return p, err
		}
	}
	from, err := runConfig(dir, p.state.Step+1)
	if err != nil || from == "" {
		return p, err
	}
	if p.changes, err = cfg.Record.ChangesFrom(from); err != nil {
		return p, err
	}
	if len(p.changes) > 0 && !allowChange {
		return p, &ConfigMismatchError{File: from, Step: p.state.Step + 1, Changes: p.changes}
	}
	return p, nil
}

// openRun creates or continues the run folder of a plan: it records the
// configuration, removes what a resume does not continue and opens the logs,
// truncated to the checkpoint a resume continues from.
func openRun(p runPlan, cfg config.Training) (*runDir, error) {
	r := &runDir{dir: p.dir, last: p.last}
	ck := filepath.Join(p.dir, "checkpoints")
	var err error
	if err = os.MkdirAll(p.dir, 0o755); err != nil {
		return nil, fmt.Errorf("trainer: %w", err)
	}
	if err := recordConfig(p, cfg); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(ck, 0o755); err != nil {
		return nil, fmt.Errorf("trainer: %w", err)
	}
	step := -1 // keep nothing logged after the checkpoint we resume from
	if p.last != "" {
		step = p.state.Step
	}
	if p.resume {
		if err := tidyCheckpoints(ck, step, p.last != "" && p.state.SFTDone); err != nil {
			return nil, err
		}
		// checkpoints/best as validation.jsonl says (a kill may have come
		// between the switches of last and best); with train.keep_best off
		// it is left as it is unless it names a checkpoint no longer there.
		if cfg.Train.KeepBest {
			err = r.repairBest(p.best)
		} else if target, lerr := os.Readlink(filepath.Join(ck, "best")); lerr == nil && !rollout.Complete(filepath.Join(ck, filepath.Base(target))) {
			err = r.repairBest(bestCheckpoint{})
		}
		if err != nil {
			return nil, err
		}
	}
	for _, f := range []struct {
		name string
		dst  **os.File
	}{{"metrics.jsonl", &r.metrics}, {"rollouts.jsonl", &r.rollouts}, {"validation.jsonl", &r.vals}, {"sft.jsonl", &r.sft}} {
		path := filepath.Join(p.dir, f.name)
		if p.resume {
			if err = truncateLog(path, step, p.last != ""); err != nil {
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

// followRun is the run folder of a plan for a rank that does not write it
// (ranks other than 0): its log methods do nothing.
func followRun(p runPlan) *runDir { return &runDir{dir: p.dir, last: p.last, follower: true} }

// recordConfig writes config.toml for a new run (or a resumed folder that
// has none) and, for a resume that allowed changes, appends the change to
// config-changes.jsonl and writes config-<step>.toml; the run's config.toml
// is never replaced by a resume.
func recordConfig(p runPlan, cfg config.Training) error {
	first := filepath.Join(p.dir, "config.toml")
	if !p.resume {
		// A folder without a run may hold the records of an abandoned one.
		olds, _ := filepath.Glob(filepath.Join(p.dir, "config-*.toml"))
		for _, f := range append(olds, filepath.Join(p.dir, "config-changes.jsonl")) {
			if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
				return fmt.Errorf("trainer: %w", err)
			}
		}
	}
	if !p.resume || !exists(first) {
		return writeConfig(first, cfg)
	}
	next := p.state.Step + 1
	// Configurations of steps past the checkpoint were never used by a
	// step that survives the resume.
	entries, err := os.ReadDir(p.dir)
	if err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	for _, e := range entries {
		if m := stepConfig.FindStringSubmatch(e.Name()); m != nil {
			if k, err := strconv.Atoi(m[1]); err == nil && k > next {
				if err := os.Remove(filepath.Join(p.dir, e.Name())); err != nil {
					return fmt.Errorf("trainer: %w", err)
				}
			}
		}
	}
	if len(p.changes) == 0 {
		return nil
	}
	// The event first: a stop before the file below repeats the event on
	// the next resume rather than losing it.
	ev := configChangeEvent{Step: next, Changes: p.changes}
	if p.last != "" {
		ev.From = filepath.Base(p.last)
	}
	line, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(p.dir, "config-changes.jsonl"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	_, err = f.Write(append(line, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("trainer: config-changes.jsonl: %w", err)
	}
	return writeConfig(filepath.Join(p.dir, fmt.Sprintf("config-%d.toml", next)), cfg)
}

// writeConfig writes cfg to path atomically.
func writeConfig(path string, cfg config.Training) error {
	tmp := path + ".tmp"
	if err := cfg.Record.Write(tmp); err != nil {
		return err
	}
	f, err := os.Open(tmp)
	if err == nil {
		err = f.Sync()
		f.Close()
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		err = syncDir(filepath.Dir(path))
	}
	if err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	return nil
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
	return atomicfile.Write(path, func(w io.Writer) error {
		_, err := w.Write(out.Bytes())
		return err
	})
}

func writeJSONLine(f *os.File, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	return appendLines(f, append(b, '\n'))
}

// appendLines appends whole lines to a log opened for appending. A write
// that fails part way (a full disk) is taken back: the file is cut to its
// size before it, so no log ends in a torn line.
func appendLines(f *os.File, b []byte) error {
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		if terr := f.Truncate(st.Size()); terr != nil {
			return fmt.Errorf("trainer: %w (and cutting the torn line: %v)", err, terr)
		}
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
	PPO        *ppoRecord         `json:"ppo,omitempty"` // train.algorithm "ppo": reward, values, advantages and returns per policy token
}

func (r *runDir) logStep(m Metrics, qs []data.Example, g int, samples []router.Sample, rewards []router.Rewards, cal calibration.Result, ppo []*ppoRecord) error {
	if r.follower {
		return nil
	}
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
		line := rolloutLine{Step: m.Step, Dataset: q.Dataset, Group: i / g, Sample: i % g, QuestionID: q.ID,
			Question: q.Question, Golden: q.Golden, RewardsRaw: raw, EM: rewards[i].EM, Advantage: cal.Advantages[i],
			Response: strings.ToValidUTF8(s.Text, "\uFFFD"), Calls: s.Calls, End: s.End, Tokens: n}
		if ppo != nil {
			line.PPO = ppo[i]
		}
		b, err := json.Marshal(line)
		if err != nil {
			return fmt.Errorf("trainer: %w", err)
		}
		buf.Write(append(b, '\n'))
	}
	if err := appendLines(r.rollouts, buf.Bytes()); err != nil {
		return err
	}
	return writeJSONLine(r.metrics, m)
}

func (r *runDir) logValidation(v rollout.ValidationResult) error {
	if r.follower {
		return nil
	}
	return writeJSONLine(r.vals, v)
}

func (r *runDir) logSFT(l SFTLine) error {
	if r.follower {
		return nil
	}
	return writeJSONLine(r.sft, l)
}

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
