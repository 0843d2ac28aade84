package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/recal-project/recal/experiments/frontier"
)

// recal frontier: package frontier evaluates the operating points and
// writes the frontier; this file parses the flags.

func frontierCommand() *cli.Command {
	lambdas := make([]string, len(frontier.DefaultCostLambdas))
	for i, l := range frontier.DefaultCostLambdas {
		lambdas[i] = strconv.FormatFloat(l, 'g', -1, 64)
	}
	return &cli.Command{
		Name:  "frontier",
		Usage: "place every router on the cost–quality plane: EM against cost per question, the single models' hull, each family's hull and AIQ, a plot",
		Description: "Evaluates on the test questions (--split or --datasets): each pool model alone, the fitted routers\n" +
			"(--routers) at each cost_lambda of --cost-lambdas, the cascade at each threshold of --thresholds (by\n" +
			"default every threshold its fitted rule routes differently at), each RL policy of --checkpoints, and\n" +
			"the oracle. Makes what is missing in --work first: the outcome matrix (recal collect) and the fitted\n" +
			"routers (recal fit); a rerun reuses them and every answer. Marks each point above or below the upper\n" +
			"hull of the single models (RouterBench's non-decreasing convex hull) and gives per family its hull,\n" +
			"AIQ, the cost at which it first reaches the best single model's EM and its EM at half that model's\n" +
			"cost. Writes --work/frontier.{json,csv,md,png,svg}. See docs/evaluation.md, \"The frontier\".",
		Flags: append(configFlags(),
			&cli.StringFlag{Name: "work", Value: "runs/frontier", Usage: "work folder: outcome matrix, fitted routers, results, outputs"},
			splitFlag(true),
			datasetsFlag(),
			&cli.StringFlag{Name: "routers", Value: "mlp,routellm-mf,routerdc,graphrouter", Usage: "fitted routers swept over --cost-lambdas (\"\" for none)"},
			&cli.StringFlag{Name: "cost-lambdas", Value: strings.Join(lambdas, ","), Usage: "comma-separated cost_lambda values of the fitted routers (finite, >= 0)"},
			&cli.StringFlag{Name: "thresholds", Usage: "comma-separated cascade thresholds in [0, 1] (default: every threshold the fitted rule routes differently at)"},
			&cli.BoolFlag{Name: "no-cascade", Usage: "leave the cascade out"},
			&cli.StringFlag{Name: "checkpoints", Usage: "comma-separated RL policies, one point each: checkpoint folders or run folders (their checkpoints/best, else last); join the seeds of one policy with + (a+b+c) for their mean ± std against the hull; NAME=... names the family of an entry's points (default policy)"},
			&cli.StringFlag{Name: "budgets", Usage: "comma-separated pool budgets in USD per question (> 0): each checkpoint is also evaluated at each, as recal serve's recal.max_cost_usd limits a request (no call once the budget is spent), a point each in its family"},
		),
		Action: func(ctx context.Context, cmd *cli.Command) error {
			cfg, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			qs, _, err := evalQuestions(cmd, cfg)
			if err != nil {
				return err
			}
			if err := setThreadsFrom(cmd, cfg.Policy.Threads); err != nil {
				return err
			}
			o := frontier.Options{Work: cmd.String("work"), NoCascade: cmd.Bool("no-cascade"), Log: slog.Default(), Progress: progressFunc()}
			o.Routers = splitList(cmd.String("routers"))
			if o.Routers == nil {
				o.Routers = []string{}
			}
			if o.CostLambdas, err = floatList(cmd, "cost-lambdas"); err != nil {
				return err
			}
			if cmd.IsSet("thresholds") {
				if o.Thresholds, err = floatList(cmd, "thresholds"); err != nil {
					return err
				}
				if o.Thresholds == nil {
					o.Thresholds = []float64{}
				}
			}
			o.Checkpoints = splitList(cmd.String("checkpoints"))
			if o.Budgets, err = floatList(cmd, "budgets"); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return usageError{err}
			}
			start := time.Now()
			rep, err := frontier.Run(ctx, cfg, qs, o)
			if err != nil {
				return err
			}
			if err := rep.Markdown(os.Stdout); err != nil {
				return err
			}
			fmt.Printf("\ntook %s; written to %s/frontier.{json,csv,md,png,svg}\n", time.Since(start).Round(time.Second), o.Work)
			return nil
		},
	}
}

// floatList parses flag name's comma-separated numbers.
func floatList(cmd *cli.Command, name string) ([]float64, error) {
	var out []float64
	for _, x := range splitList(cmd.String(name)) {
		v, err := strconv.ParseFloat(x, 64)
		if err != nil {
			return nil, usageError{fmt.Errorf("%s: --%s: %q is not a number", cmd.FullName(), name, x)}
		}
		out = append(out, v)
	}
	return out, nil
}
