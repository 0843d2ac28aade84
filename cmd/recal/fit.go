package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/eval/baselines"
	"github.com/recal-project/recal/eval/embed"
)

func fitCommand() *cli.Command {
	return &cli.Command{
		Name:  "fit",
		Usage: "fit the trainable baseline routers (" + strings.Join(baselines.Names(), ", ") + ") on an outcome matrix",
		Description: "Reads the outcome matrix of --outcomes (made by recal collect), embeds its questions\n" +
			"([embedding]) and fits each router of --routers with its [baselines.*] table, deterministically\n" +
			"for --seed, into --router-dir/<router> (replaced whole): manifest.json, weights.safetensors\n" +
			"and the embedder's fitted state. recal eval --routers ... --router-dir DIR evaluates them.",
		Flags: append(configFlags(),
			&cli.StringFlag{Name: "outcomes", Usage: "outcome folder made by recal collect --out"},
			&cli.StringFlag{Name: "router-dir", Usage: "folder receiving one sub-folder per fitted router"},
			&cli.StringFlag{Name: "routers", Value: strings.Join(baselines.Names(), ","), Usage: "comma-separated routers to fit"},
			&cli.IntFlag{Name: "seed", Usage: "seed of the initialisation and data order (default train.seed)"},
		),
		Action: runFit,
	}
}

// embeddingCache is the openai embeddings' disk cache: beside the pool's.
func embeddingCache(cfg config.Config) string { return embed.CacheDir(cfg.Pool.CacheDir) }

// newEmbedder builds the [embedding] provider.
func newEmbedder(cfg config.Config) (embed.Embedder, error) {
	return embed.New(cfg.Embedding, embed.WithLogger(slog.Default()), embed.WithCacheDir(embeddingCache(cfg)))
}

func runFit(ctx context.Context, cmd *cli.Command) error {
	if err := requireFlags(cmd, "outcomes", "router-dir"); err != nil {
		return err
	}
	cfg, err := loadConfig(cmd)
	if err != nil {
		return err
	}
	names := splitList(cmd.String("routers"))
	for _, n := range names {
		if !slices.Contains(baselines.Names(), n) {
			return usageError{fmt.Errorf("fit: --routers: unknown router %q (known: %s)", n, strings.Join(baselines.Names(), ", "))}
		}
	}
	seed := cfg.Train.Seed
	if cmd.IsSet("seed") {
		seed = int64(cmd.Int("seed"))
	}
	m, err := baselines.LoadMatrix(cmd.String("outcomes"))
	if err != nil {
		return err
	}
	emb, err := newEmbedder(cfg)
	if err != nil {
		return err
	}
	slog.Info("fitting", "routers", strings.Join(names, ","), "questions", len(m.Questions), "models", len(m.Models),
		"embedding", emb.Info().Provider+"/"+emb.Info().Model, "matrix", m.Digest)
	for _, name := range names {
		start := time.Now()
		r, err := baselines.Fit(ctx, name, cfg.Baselines, m, emb, seed)
		if err != nil {
			return err
		}
		dir := filepath.Join(cmd.String("router-dir"), name)
		if err := r.Save(dir); err != nil {
			return err
		}
		took := time.Since(start).Round(time.Millisecond)
		v := r.Manifest().Validation
		slog.Info("fitted", "router", name, "dir", dir, "took", took.String())
		if v.Questions == 0 {
			fmt.Printf("%-12s %s  fitted in %v (no held-out questions: baselines.val_share = 0)\n", name, dir, took)
			continue
		}
		fmt.Printf("%-12s %s  fitted in %v; on %d held-out questions its picks' mean F1 %.3f, relative cost %.3f, F1 − cost_lambda·cost %.3f (check %d of %d kept)\n",
			name, dir, took, v.Questions, v.F1, v.Cost, v.Utility, v.Check, v.Checks)
	}
	return nil
}

// checkFitted is the dry run's check of a fitted baseline router: its
// folder under routerDir loads with the configured embeddings (nil for
// routers that are not fitted ones).
func checkFitted(cfg config.Config, name, routerDir string) error {
	if !slices.Contains(baselines.Names(), name) {
		return nil
	}
	if routerDir == "" {
		return fmt.Errorf("%s needs --router-dir, a folder made by `recal collect --out OUTCOMES` then `recal fit --outcomes OUTCOMES --router-dir DIR`", name)
	}
	emb, err := embed.New(cfg.Embedding) // no cache folder: a dry run creates nothing
	if err != nil {
		return err
	}
	if _, err := baselines.Load(filepath.Join(routerDir, name), emb); err != nil {
		return fmt.Errorf("%s: %w (fit it with `recal fit --outcomes OUTCOMES --router-dir %s --routers %s`)", name, err, routerDir, name)
	}
	return nil
}
