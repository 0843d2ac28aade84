package trainer

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/recal-project/recal/config"
)

// Experiments that train a run once and reuse it afterwards (Table 1's
// Router-R1 policy, the ablation's warm-ups and variants) decide with these
// whether a run folder that holds checkpoints is theirs and done. Their
// errors carry no prefix: the caller adds its own (table1, ablate).

// TrainedAs checks that the run in dir, which has checkpoints, was trained
// with cfg as `recal train --resume` would accept it (CheckResume):
// every key but config.OperationalKeys must match the run's configuration,
// and train.steps too under a decaying train.lr_schedule. A table must not
// name one configuration and report another's policy.
func TrainedAs(dir string, cfg config.Training) error {
	if !exists(filepath.Join(dir, "config.toml")) {
		return fmt.Errorf("%s has checkpoints but no config.toml: what it was trained with is unknown; remove it to train it again", dir)
	}
	err := CheckResume(dir, cfg)
	if e, ok := errors.AsType[*ConfigMismatchError](err); ok {
		var keys []string
		for _, c := range e.Changes {
			keys = append(keys, fmt.Sprintf("%s: %s in the run, %s now", c.Key, c.Old, c.New))
		}
		return fmt.Errorf("%s was trained with another configuration (%s); restore it, or remove that run to train it again", dir, strings.Join(keys, "; "))
	}
	return err
}

// Finished reports whether a run's last checkpoint is at its final step.
func Finished(dir string, steps int) (bool, error) {
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
