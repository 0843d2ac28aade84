package table1

import (
	"context"
	"log/slog"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/eval"
)

// The steps Run makes, for commands that make the same (recal frontier):
// each is reused when its inputs have not changed.

// Collect asks the pool what the outcome folder dir lacks, as recal collect
// does, and returns the pairs asked and the pool calls made.
func Collect(ctx context.Context, cfg config.Config, dir string, log *slog.Logger) (int, int64, error) {
	return collect(ctx, cfg, dir, log)
}

// Fit fits each router of names into routerDir/<name> unless it was fitted
// from the same matrix, [baselines], [embedding] and seed, and returns the
// ones it fitted.
func Fit(ctx context.Context, cfg config.Config, outcomes, routerDir string, names []string, log *slog.Logger) ([]string, error) {
	return fit(ctx, cfg, outcomes, routerDir, names, log)
}

// OpenSetup opens checkpoint ck and a pool for evaluating qs; close frees
// them.
func OpenSetup(cfg config.Config, ck string, qs []data.Example, log *slog.Logger) (s eval.Setup, close func(), err error) {
	rs, err := openSetup(cfg, ck, qs, Options{Log: log})
	if err != nil {
		return eval.Setup{}, nil, err
	}
	return rs.setup, rs.close, nil
}
