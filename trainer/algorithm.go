package trainer

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/recal-project/recal/calibration"
	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/router"
	"github.com/recal-project/recal/torchbridge"
)

// algorithms registers the policy-gradient algorithms train.algorithm
// chooses from, each built from the configuration by the same signature.
// Train looks the name up once; nothing else asks which one runs.
var algorithms = map[string]func(cfg config.Training) algorithm{
	"grpo": newGRPO,
	"ppo":  newPPO,
}

// Algorithms lists the names train.algorithm accepts.
func Algorithms() []string { return slices.Sorted(maps.Keys(algorithms)) }

// newAlgorithm builds the algorithm cfg.Train.Algorithm names.
func newAlgorithm(cfg config.Training) (algorithm, error) {
	mk, ok := algorithms[cfg.Train.Algorithm]
	if !ok {
		return nil, fmt.Errorf("trainer: train.algorithm = %q: unknown; known algorithms: %s", cfg.Train.Algorithm, strings.Join(Algorithms(), ", "))
	}
	return mk(cfg), nil
}

// algorithm is what differs between the policy-gradient algorithms of a
// training step: what the policy carries beside the language model, how a
// step's scored responses become the advantages (and value targets) the loss
// trains with, the loss's and the optimizer's extra settings, and the
// algorithm's own metrics.
type algorithm interface {
	// prepare readies a policy just loaded from dir; resumed says dir is a
	// checkpoint of this run, which must then hold the algorithm's state.
	prepare(p *torchbridge.Policy, dir string, resumed bool) error
	// advantages fills the loss inputs of b.seqs, b.logged and b.ppo. It
	// runs after the reference log-probs are in b.seqs.
	advantages(ctx context.Context, p *torchbridge.Policy, b *stepBatch) error
	// loss and adamW adjust the loss and optimizer settings of [train].
	loss(lo torchbridge.LossOptions) torchbridge.LossOptions
	adamW(a torchbridge.AdamW) torchbridge.AdamW
	// metrics adds the algorithm's own numbers to the step's metrics line.
	metrics(b *stepBatch, loss torchbridge.LossStats, m *Metrics)
}

// stepBatch is one training step's responses on their way to the loss.
type stepBatch struct {
	qs      []data.Example // the step's questions; response i answers qs[i/g]
	g       int            // responses per question
	samples []router.Sample
	rewards []router.Rewards // raw components, with the balance counts from before the step
	seqs    []torchbridge.Sequence
	st      *State // the trainer state (PPO keeps its cost window there)

	// logged holds one advantage per response for rollouts.jsonl's
	// "advantage" and the metrics (GRPO: the calibrated Â the loss used).
	logged calibration.Result
	// ppo holds PPO's per-response record for rollouts.jsonl (nil for GRPO).
	ppo []*ppoRecord
}

// grpo is ReCal's GRPO: one advantage per response, the calibrated Â of
// the ReCal paper's Eqs. 6–14 (calibration.Calibrate; gating, component-wise
// advantages, variance reweighting and per-dataset normalisation, each
// switchable), in the clipped objective of its Eq. 15 with the k3 KL penalty
// in the loss (docs/method.md, sections 5 and 6).
type grpo struct{ cal calibration.Config }

func newGRPO(cfg config.Training) algorithm { return grpo{cal: cfg.Calibration} }

func (grpo) prepare(*torchbridge.Policy, string, bool) error { return nil }

func (a grpo) advantages(_ context.Context, _ *torchbridge.Policy, b *stepBatch) error {
	batch := make([]calibration.Response, len(b.samples))
	for i := range b.samples {
		batch[i] = calibration.Response{Group: i / b.g, Dataset: b.qs[i/b.g].Dataset, Raw: rawOf(b.rewards[i])}
	}
	cal, err := calibration.Calibrate(a.cal, batch)
	if err != nil {
		return err
	}
	b.logged = cal
	for i := range b.seqs {
		b.seqs[i].Advantage = float32(cal.Advantages[i])
	}
	return nil
}

func (grpo) loss(lo torchbridge.LossOptions) torchbridge.LossOptions { return lo }
func (grpo) adamW(a torchbridge.AdamW) torchbridge.AdamW             { return a }
func (grpo) metrics(*stepBatch, torchbridge.LossStats, *Metrics)     {}
