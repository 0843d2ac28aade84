package frontier

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/eval"
	"github.com/recal-project/recal/eval/baselines"
	"github.com/recal-project/recal/eval/embed"
	"github.com/recal-project/recal/experiments/table1"
	"github.com/recal-project/recal/internal/rollout"
)

// DefaultCostLambdas is the cost_lambda sweep of the fitted routers.
var DefaultCostLambdas = []float64{0, 0.1, 0.3, 1, 3, 10}

// Options of Run.
type Options struct {
	// Work holds every step (outcomes/, routers/, eval/) and the outputs
	// (frontier.{json,csv,md,png,svg}); a rerun reuses every step.
	Work string
	// Routers are the fitted routers swept (baselines.Names() when nil).
	Routers []string
	// CostLambdas is their cost_lambda sweep: finite, >= 0, at least one.
	CostLambdas []float64
	// Thresholds is the cascade's threshold sweep, each in [0, 1]; nil:
	// every threshold that routes differently (CascadeRule.Thresholds).
	Thresholds []float64
	// NoCascade leaves the cascade out.
	NoCascade bool
	// Checkpoints are RL policies, each one point of family "policy": a
	// checkpoint folder, or a run folder (its checkpoints/best, else last).
	// An entry joining several with "+" holds the seeds of one policy: a
	// point each, and their mean and spread (Report.Seeds). An entry
	// "NAME=..." names the family of its points (and its seeds' group)
	// NAME instead (a letter, then letters, digits, "-" or "_").
	Checkpoints []string
	// Budgets are pool budgets in USD per question (each > 0), at which
	// every checkpoint is evaluated too, as `recal serve`'s per-request
	// recal.max_cost_usd limits a response: a point each, in the
	// checkpoint's family, so one checkpoint traces its own frontier.
	Budgets  []float64
	Log      *slog.Logger
	Progress func(router string, done, total int)
}

// ErrOptions: a sweep the frontier cannot run.
var ErrOptions = errors.New("frontier: bad sweep")

// Validate checks o before anything runs; errors name the flag.
func (o Options) Validate() error {
	if o.Work == "" {
		return fmt.Errorf("%w: --work is required", ErrOptions)
	}
	if len(o.Routers) > 0 && len(o.CostLambdas) == 0 {
		return fmt.Errorf("%w: --cost-lambdas is empty: give at least one cost_lambda", ErrOptions)
	}
	for _, l := range o.CostLambdas {
		if err := baselines.CheckCostLambda("--cost-lambdas", l); err != nil {
			return fmt.Errorf("%w: %v", ErrOptions, err)
		}
	}
	if o.Thresholds != nil && len(o.Thresholds) == 0 && !o.NoCascade {
		return fmt.Errorf("%w: --thresholds is empty: give at least one threshold, or none for the rule's own", ErrOptions)
	}
	for _, t := range o.Thresholds {
		if err := baselines.CheckThreshold("--thresholds", t); err != nil {
			return fmt.Errorf("%w: %v", ErrOptions, err)
		}
	}
	for _, r := range o.Routers {
		if !slices.Contains(baselines.Names(), r) {
			return fmt.Errorf("%w: --routers: %q is not a fitted router (known: %v)", ErrOptions, r, baselines.Names())
		}
	}
	for _, b := range o.Budgets {
		if !(b > 0) || math.IsInf(b, 0) {
			return fmt.Errorf("%w: --budgets: %v USD, want a finite budget > 0", ErrOptions, b)
		}
	}
	for _, entry := range o.Checkpoints {
		name, paths := splitEntry(entry)
		if slices.Contains([]string{FamilySingle, FamilyCascade, FamilyOracle}, name) || slices.Contains(baselines.Names(), name) {
			return fmt.Errorf("%w: --checkpoints %s: %q names another family of points; choose another name", ErrOptions, entry, name)
		}
		for _, ck := range paths {
			if _, err := os.Stat(ck); err != nil {
				return fmt.Errorf("%w: --checkpoints: %v", ErrOptions, err)
			}
		}
	}
	return nil
}

// Run evaluates every operating point on qs (each single pool model, the
// fitted routers at each cost_lambda, the cascade at each threshold, each
// RL checkpoint, the oracle), analyses them (Analyze) and writes the
// outputs into o.Work. Every evaluation is eval's, resumed from its
// results files, so a rerun asks the pool nothing and refits nothing.
func Run(ctx context.Context, cfg config.Config, qs []data.Example, o Options) (Report, error) {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Routers == nil {
		o.Routers = baselines.Names()
	}
	if err := o.Validate(); err != nil {
		return Report{}, err
	}
	if len(qs) == 0 {
		return Report{}, fmt.Errorf("%w: no test questions", ErrOptions)
	}
	outcomes := filepath.Join(o.Work, "outcomes")
	routerDir := filepath.Join(o.Work, "routers")
	evalDir := filepath.Join(o.Work, "eval")
	if _, _, err := table1.Collect(ctx, cfg, outcomes, o.Log); err != nil {
		return Report{}, fmt.Errorf("frontier: collect: %w", err)
	}
	if _, err := table1.Fit(ctx, cfg, outcomes, routerDir, o.Routers, o.Log); err != nil {
		return Report{}, fmt.Errorf("frontier: fit: %w", err)
	}

	train, val, err := cfg.Data.LoadTrain()
	if err != nil {
		return Report{}, err
	}
	env, err := rollout.NewEnv(cfg.Rollout(), nil, rollout.AnswerBank(train, val, qs), o.Log)
	if err != nil {
		return Report{}, err
	}
	defer env.Close()
	s := eval.Setup{Env: env, Batch: cfg.Eval.Batch, Seed: cfg.Train.Seed, Pool: cfg.Pool, InDomain: cfg.Data.InDomain(),
		Embedding: cfg.Embedding, EmbeddingCache: embed.CacheDir(cfg.Pool.CacheDir), RouterDir: routerDir, Outcomes: outcomes}

	var ps []Point
	singles, refs, err := eval.SingleRows(ctx, s, qs, filepath.Join(evalDir, "reference"), o.Log, o.Progress)
	if err != nil {
		return Report{}, err
	}
	for _, r := range singles {
		ps = append(ps, point(FamilySingle, r.Model, nil, r))
	}
	for _, l := range o.CostLambdas {
		s.CostLambda = &l
		tab, err := eval.Run(ctx, s, qs, o.Routers, filepath.Join(evalDir, "lambda-"+fmtSetting(l)), o.Log, o.Progress)
		if err != nil {
			return Report{}, err
		}
		for _, r := range tab.Rows {
			ps = append(ps, point(r.Router, fmt.Sprintf("%s λ=%s", r.Router, fmtSetting(l)), &l, r))
		}
	}
	s.CostLambda = nil
	if !o.NoCascade {
		thresholds := o.Thresholds
		if thresholds == nil {
			m, err := baselines.LoadMatrix(outcomes)
			if err != nil {
				return Report{}, err
			}
			rule, err := baselines.FitCascade(m)
			if err != nil {
				return Report{}, err
			}
			thresholds = rule.Thresholds()
		}
		for _, t := range thresholds {
			s.CascadeThreshold = t
			tab, err := eval.Run(ctx, s, qs, []string{"cascade"}, filepath.Join(evalDir, "cascade-"+fmtSetting(t)), o.Log, o.Progress)
			if err != nil {
				return Report{}, err
			}
			ps = append(ps, point(FamilyCascade, fmt.Sprintf("cascade t=%.3g", t), &t, tab.Rows[0]))
		}
	}
	n := 0 // policy-N: the N-th checkpoint of the flag, seeds counted one by one
	for _, entry := range o.Checkpoints {
		name, seeds := splitEntry(entry)
		group := entry
		if name != "" {
			group = name
		}
		for _, ck := range seeds {
			pts, err := policyPoints(ctx, cfg, qs, ck, filepath.Join(evalDir, fmt.Sprintf("policy-%d", n)), o)
			if err != nil {
				return Report{}, err
			}
			for _, p := range pts {
				if name != "" {
					p.Family = name
				}
				if len(seeds) > 1 {
					p.Group = group
					if p.Setting != nil { // a budget's point
						p.Group = fmt.Sprintf("%s $%s", group, fmtSetting(*p.Setting))
					}
				}
				ps = append(ps, p)
			}
			n++
		}
	}
	for _, r := range refs {
		if r.Reference == eval.RefOracle {
			ps = append(ps, point(FamilyOracle, "oracle", nil, r))
		}
	}
	rep, err := Analyze(ps)
	if err != nil {
		return Report{}, err
	}
	if err := rep.Write(o.Work); err != nil {
		return Report{}, err
	}
	return rep, nil
}

// familyName is a --checkpoints entry's NAME.
var familyName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]*$`)

// splitEntry splits a --checkpoints entry "[NAME=]PATH[+PATH...]" into its
// name ("" for none) and paths. A "=" in a path (no name before it
// matches familyName) is part of the path.
func splitEntry(entry string) (name string, paths []string) {
	if n, rest, ok := strings.Cut(entry, "="); ok && familyName.MatchString(n) {
		name, entry = n, rest
	}
	return name, strings.Split(entry, "+")
}

// policyPoints evaluates RL checkpoint ck's policy router into dir, then
// at each of o.Budgets into dir-budget-B: its point with no budget first,
// then one a budget (Setting: the budget).
func policyPoints(ctx context.Context, cfg config.Config, qs []data.Example, ck, dir string, o Options) ([]Point, error) {
	path, _, err := rollout.ResolveCheckpoint(ck) // a run folder: its checkpoints/best, else last
	if err != nil {
		return nil, fmt.Errorf("frontier: --checkpoints %s: %w", ck, err)
	}
	s, closeAll, err := table1.OpenSetup(cfg, path, qs, o.Log)
	if err != nil {
		return nil, fmt.Errorf("frontier: --checkpoints %s: %w", ck, err)
	}
	defer closeAll()
	tab, err := eval.Run(ctx, s, qs, []string{"policy"}, dir, o.Log, o.Progress)
	if err != nil {
		return nil, err
	}
	out := []Point{point(FamilyPolicy, ck, nil, tab.Rows[0])}
	env := s.Env
	for _, b := range o.Budgets {
		s.Env = env.WithBudget(b)
		tab, err := eval.Run(ctx, s, qs, []string{"policy"}, dir+"-budget-"+fmtSetting(b), o.Log, o.Progress)
		if err != nil {
			return nil, err
		}
		out = append(out, point(FamilyPolicy, fmt.Sprintf("%s $%s", ck, fmtSetting(b)), &b, tab.Rows[0]))
	}
	return out, nil
}

func point(family, label string, setting *float64, r eval.Row) Point {
	var st *float64
	if setting != nil {
		v := *setting
		st = &v
	}
	p := Point{Family: family, Label: label, Setting: st, EM: r.Avg.EM, F1: r.Avg.F1, Cost: r.CostPerQuestion, Calls: r.Avg.Calls}
	if r.Routing != nil && r.Reference == "" {
		p.Shares = r.Routing.CallShare
	}
	return p
}

// fmtSetting writes a swept value as its shortest decimal ("0.3", "1").
func fmtSetting(x float64) string {
	if math.IsInf(x, 0) || math.IsNaN(x) {
		return fmt.Sprint(x)
	}
	return strconv.FormatFloat(x, 'g', -1, 64)
}
