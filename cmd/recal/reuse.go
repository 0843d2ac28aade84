package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/trainer"
)

// Commands that train a run once and reuse it afterwards (recal table1's
// Router-R1 policy, recal ablate's warm-ups and variants) decide with these
// whether a run folder that holds checkpoints is theirs and done. Their
// errors carry no command prefix: the caller adds its own.

// trainedAs checks that the run in dir, which has checkpoints, was trained
// with cfg as `recal train --resume` would accept it (trainer.CheckResume):
// every key but trainer.OperationalKeys must match the run's configuration,
// and train.steps too under a decaying train.lr_schedule. A table must not
// name one configuration and report another's policy.
func trainedAs(dir string, cfg config.Config) error {
	if !fileExists(filepath.Join(dir, "config.toml")) {
		return fmt.Errorf("%s has checkpoints but no config.toml: what it was trained with is unknown; remove it to train it again", dir)
	}
	err := trainer.CheckResume(dir, cfg)
	if e, ok := errors.AsType[*trainer.ConfigMismatchError](err); ok {
		var keys []string
		for _, c := range e.Changes {
			keys = append(keys, fmt.Sprintf("%s: %s in the run, %s now", c.Key, c.Old, c.New))
		}
		return fmt.Errorf("%s was trained with another configuration (%s); restore it, or remove that run to train it again", dir, strings.Join(keys, "; "))
	}
	return err
}

// finished reports whether a run's last checkpoint is at its final step.
func finished(dir string, steps int) (bool, error) {
	path := filepath.Join(dir, "checkpoints", "last", "trainer_state.json")
	b, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	var st struct {
		Step *int `json:"step"`
	}
	if err := json.Unmarshal(b, &st); err != nil || st.Step == nil {
		return false, fmt.Errorf("%s: no step in it (%v)", path, err)
	}
	if *st.Step > steps {
		return false, fmt.Errorf("%s is at step %d, past train.steps = %d; remove that run to train it again", path, *st.Step, steps)
	}
	return *st.Step == steps, nil
}
