package trainer

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/recal-project/recal/config"
)

// ConfigMismatchError refuses a resume whose configuration would change what
// the run computes.
type ConfigMismatchError struct {
	File    string          // the run's configuration it was compared with
	Step    int             // the step the new values would take effect at
	Changes []config.Change // sorted by key
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
	Step    int             `json:"step"` // the first GRPO step computed with the new values (config-<step>.toml)
	From    string          `json:"resumed_from,omitempty"`
	Changes []config.Change `json:"changes"`
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
// config.OperationalKeys), a *ConfigMismatchError naming the training keys that
// differ, or the error that resume would stop with. It writes nothing.
// Commands that reuse or continue a run (recal table1, recal ablate) check
// with it, so that they accept exactly what train --resume accepts.
func CheckResume(dir string, cfg config.Training) error {
	_, err := inspectRun(dir, cfg, true, false)
	return err
}

// RunConfigFile returns the configuration file the run in dir trained its
// latest steps with (config-K.toml of the largest K, else config.toml; see
// runConfig); "" when the run has none. config.ReadRunFile reads it.
func RunConfigFile(dir string) (string, error) { return runConfig(dir, math.MaxInt) }
