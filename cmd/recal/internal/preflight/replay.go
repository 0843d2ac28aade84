package preflight

import (
	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/llmpool"
)

// Replay makes sure, when a pool model of cfg is replayed from an outcome
// log (provider "replay"), that its log has a row for every question of
// [data] (training, validation and test), so that a missing one is an
// error before a command starts, not a failed call deep into a run. cfg's
// paths are used as config.Load resolved them. The commands call it right
// after loading their configuration: config.Load parses and validates,
// and reads no data.
func Replay(cfg config.Config) error {
	replayed := false
	for _, m := range cfg.Pool.Models {
		replayed = replayed || m.Provider == "replay"
	}
	if !replayed {
		return nil
	}
	train, val, err := cfg.Data.LoadTrain()
	if err != nil {
		return err
	}
	test, err := cfg.Data.LoadTest()
	if err != nil {
		return err
	}
	var qs []llmpool.Question
	for _, set := range [][]data.Example{train, val, test} {
		for _, ex := range set {
			qs = append(qs, llmpool.Question{ID: ex.ID, Dataset: ex.Dataset, Text: ex.Question, Golden: ex.Golden})
		}
	}
	return llmpool.CheckReplay(cfg.Pool, qs)
}
