package eval

import (
	"log/slog"
	"os"
	"path/filepath"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/eval/embed"
	"github.com/recal-project/recal/internal/rollout"
)

// Open opens checkpoint ck (on policy.device, in policy.dtype) in cfg's
// routing environment for evaluating qs: its pool's simulated models draw
// wrong answers from the golden answers of the training, validation and
// test questions. The setup holds what cfg decides (eval.batch, the seed,
// the pool, [embedding] and its cache beside the pool's); the caller adds
// the choices of its routers. close closes the pool and the policy.
func Open(cfg config.Config, ck string, qs []data.Example, log *slog.Logger) (s Setup, close func(), err error) {
	train, val, err := cfg.Data.LoadTrain()
	if err != nil {
		return Setup{}, nil, err
	}
	env, closeAll, err := rollout.Open(cfg, ck, rollout.AnswerBank(train, val, qs), log)
	if err != nil {
		return Setup{}, nil, err
	}
	s = Setup{Env: env, Batch: cfg.Eval.Batch, Seed: cfg.Train.Seed, Pool: cfg.Pool, Embedding: cfg.Embedding,
		EmbeddingCache: embed.CacheDir(cfg.Pool.CacheDir), InDomain: cfg.Data.InDomain()}
	return s, closeAll, nil
}

// DefaultOut is recal eval's output folder for the test selection sel
// (a split's name, or datasets joined by "+") when --out is not given:
// eval-<sel> in the run folder of checkpoint (RUN/checkpoints/X) when
// there is one (it holds config.toml), else runs/eval-<sel>.
func DefaultOut(checkpoint, sel string) string {
	run := filepath.Dir(filepath.Dir(filepath.Clean(checkpoint)))
	if !exists(filepath.Join(run, "config.toml")) {
		return filepath.Join("runs", "eval-"+sel)
	}
	return filepath.Join(run, "eval-"+sel)
}

// RunRollouts is the rollouts.jsonl of checkpoint's run (RUN/checkpoints/X),
// the knn routers' logged outcomes, or "" when there is none.
func RunRollouts(checkpoint string) string {
	if guess := filepath.Join(filepath.Dir(filepath.Dir(filepath.Clean(checkpoint))), "rollouts.jsonl"); exists(guess) {
		return guess
	}
	return ""
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
