package baselines

import (
	"context"
	"errors"
	"math"
	"testing"
)

// SetCostLambda moves every router along its cost trade-off without a
// refit: a large cost_lambda routes every question to the cheapest model;
// back at 0 it routes as fitted.
func TestSetCostLambda(t *testing.T) {
	m, _ := syntheticMatrix(300, 1)
	cfg := DefaultConfig()
	cfg.MLP.Epochs, cfg.RouteLLMMF.Epochs, cfg.RouterDC.Epochs, cfg.GraphRouter.Steps = 3, 3, 3, 20
	qs := make([]Query, 40)
	for i := range qs {
		qs[i] = Query{Text: m.Questions[i].Text, Dataset: m.Questions[i].Dataset}
	}
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			r, err := Fit(context.Background(), name, cfg, m, localEmbedder(t, 256), 0)
			if err != nil {
				t.Fatal(err)
			}
			fitted, err := r.Route(context.Background(), qs)
			if err != nil {
				t.Fatal(err)
			}
			if err := r.SetCostLambda(1e6); err != nil {
				t.Fatal(err)
			}
			cheap, _ := r.Route(context.Background(), qs)
			for i, p := range cheap {
				if p != "m-astro" { // 1 micro-USD, the cheapest
					t.Fatalf("question %d routed to %s at cost_lambda 1e6, want the cheapest model", i, p)
				}
			}
			if err := r.SetCostLambda(0); err != nil {
				t.Fatal(err)
			}
			again, _ := r.Route(context.Background(), qs)
			for i := range again {
				if again[i] != fitted[i] {
					t.Fatalf("question %d: %s at cost_lambda 0 again, %s as fitted (at 0)", i, again[i], fitted[i])
				}
			}
			for _, bad := range []float64{math.NaN(), -1, math.Inf(1)} {
				if err := r.SetCostLambda(bad); !errors.Is(err, ErrCostLambda) {
					t.Errorf("cost_lambda %v: error %v, want ErrCostLambda", bad, err)
				}
			}
		})
	}
}
