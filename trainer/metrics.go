package trainer

import (
	"fmt"
	"log/slog"
	"math"
	"os"
	"strings"
	"time"

	"github.com/recal-project/recal/calibration"
	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/router"
	"github.com/recal-project/recal/torchbridge"
)

// Metrics is one line of metrics.jsonl: means over the step's responses.
type Metrics struct {
	Step             int                `json:"step"`
	Reward           map[string]float64 `json:"reward"` // mean raw component, before gating
	EM               float64            `json:"em"`
	F1               float64            `json:"f1"`                 // = reward.ans
	CallsPerQuestion float64            `json:"calls_per_question"` // pool calls per response
	ModelShare       map[string]float64 `json:"model_share"`        // share of the step's calls per model
	TopShare         float64            `json:"top_share"`          // share of the step's calls to the dearest pool model (highest price_in + price_out): routing collapse shows here
	Advantage        float64            `json:"advantage_std"`
	Entropy          float64            `json:"entropy"`   // mean over policy tokens
	KL               float64            `json:"kl"`        // mean k3 KL over policy tokens
	ClipFrac         float64            `json:"clip_frac"` // share of policy tokens clipped
	Ratio            float64            `json:"ratio"`
	Loss             float64            `json:"loss"`
	GradNorm         float64            `json:"grad_norm"` // mean over the step's applied optimizer updates, before clipping
	LR               float64            `json:"lr"`        // the policy's learning rate this step (train.lr_schedule)
	StepTime         float64            `json:"step_time_s"`
	RolloutTime      float64            `json:"rollout_time_s"` // wall time of the step's rollouts; with several ranks the slowest rank's (max over ranks)
	ScoreTime        float64            `json:"score_time_s"`   // this rank's rewards, gather, KL reference scoring and advantages
	UpdateTime       float64            `json:"update_time_s"`  // this rank's loss forwards and backwards, gradient reduction and optimizer steps
	TokensPerSec     float64            `json:"tokens_per_s"`   // policy tokens generated and trained per second
	PolicyTokens     float64            `json:"policy_tokens"`
	Cost             float64            `json:"cost"` // USD spent on the pool this step
	PoolFailures     int64              `json:"pool_failures"`
	WellFormed       float64            `json:"well_formed"`

	// SkippedUpdates is the step's optimizer updates skipped for a non-finite
	// gradient norm (weights and optimizer unchanged); SkippedUpdatesTotal
	// the same over the run so far.
	SkippedUpdates      int `json:"skipped_updates"`
	SkippedUpdatesTotal int `json:"skipped_updates_total"`

	// DevicePeakGiB is, on a GPU, this rank's peak of memory held by tensors
	// (the CUDA caching allocator's counter) in each phase of the step:
	// rollout, reference (the KL reference's scoring), update (the loss's
	// forwards and backwards) and step (reduction and optimizer step), the
	// phases of the dry run's memory plan. Absent on the CPU.
	DevicePeakGiB map[string]float64 `json:"device_peak_gib,omitempty"`

	*PPOMetrics // train.algorithm "ppo" only: value loss, explained variance, …
}

func stepMetrics(step int, samples []router.Sample, rewards []router.Rewards, cal calibration.Result, loss torchbridge.LossStats,
	gradNorms []float64, rs router.Stats, usage llmpool.UsageMap, questions int, took time.Duration, models []llmpool.ModelInfo) Metrics {
	n := float64(len(samples))
	m := Metrics{Step: step, Reward: map[string]float64{}, ModelShare: map[string]float64{}}
	for _, c := range router.Components {
		for _, r := range rewards {
			m.Reward[c] += r.Get(c) / n
		}
	}
	for _, r := range rewards {
		m.EM += r.EM / n
	}
	m.F1 = m.Reward["ans"]
	m.WellFormed = m.Reward["format"]
	for _, mi := range models {
		m.ModelShare[mi.Name] = 0
	}
	calls := 0
	for _, s := range samples {
		for _, c := range s.CalledModels() {
			m.ModelShare[c]++
			calls++
		}
	}
	if calls > 0 {
		for k := range m.ModelShare {
			m.ModelShare[k] /= float64(calls)
		}
	}
	m.CallsPerQuestion = float64(calls) / n
	if len(models) > 0 {
		top := models[0]
		for _, mi := range models[1:] {
			if mi.PriceIn+mi.PriceOut > top.PriceIn+top.PriceOut {
				top = mi
			}
		}
		m.TopShare = m.ModelShare[top.Name]
	}
	var mean, sq float64
	for _, a := range cal.Advantages {
		mean += a / n
	}
	for _, a := range cal.Advantages {
		sq += (a - mean) * (a - mean) / n
	}
	m.Advantage = math.Sqrt(sq)
	// A non-finite policy (NaN weights, overflow) makes these NaN, which JSON
	// cannot hold: they are logged as 0, and skipped_updates tells why.
	if loss.Tokens > 0 {
		m.Entropy = finite(loss.Entropy / loss.Tokens)
		m.KL = finite(loss.KL / loss.Tokens)
		m.ClipFrac = finite(loss.Clipped / loss.Tokens)
		m.Ratio = finite(loss.Ratio / loss.Tokens)
	}
	m.Loss = finite(loss.Loss)
	for _, g := range gradNorms {
		m.GradNorm += finite(g) / float64(len(gradNorms))
	}
	m.PolicyTokens = loss.Tokens
	m.StepTime = took.Seconds()
	m.RolloutTime = rs.Wall.Seconds()
	if took > 0 {
		m.TokensPerSec = loss.Tokens / took.Seconds()
	}
	tot := usage.Total()
	m.Cost = tot.Cost
	m.PoolFailures = tot.Failures
	return m
}

// progress shows a bar on a terminal and plain log lines otherwise.
type progress struct {
	total   int
	every   time.Duration
	last    time.Time
	start   time.Time
	tty     bool
	log     *slog.Logger
	started int
}

func newProgress(total int, everySec float64, log *slog.Logger) *progress {
	st, _ := os.Stderr.Stat()
	return &progress{total: total, every: time.Duration(everySec * float64(time.Second)), start: time.Now(), log: log,
		tty: st != nil && st.Mode()&os.ModeCharDevice != 0, started: -1}
}

func (p *progress) update(m Metrics) {
	if p.started < 0 {
		p.started = m.Step - 1
	}
	done := m.Step - p.started
	eta := time.Duration(0)
	if done > 0 {
		eta = time.Since(p.start) / time.Duration(done) * time.Duration(p.total-m.Step)
	}
	if p.tty {
		width := 30
		fill := width * m.Step / max(p.total, 1)
		fmt.Fprintf(os.Stderr, "\r[%s%s] step %d/%d  ans %.3f  format %.2f  calls %.2f  %.1fs/step  eta %s ",
			strings.Repeat("=", fill), strings.Repeat(" ", width-fill), m.Step, p.total, m.Reward["ans"], m.Reward["format"],
			m.CallsPerQuestion, m.StepTime, eta.Round(time.Second))
		return
	}
	if time.Since(p.last) >= p.every || m.Step == p.total {
		p.last = time.Now()
		p.log.Info("step", "step", m.Step, "of", p.total, "ans", fmt.Sprintf("%.3f", m.Reward["ans"]),
			"format", fmt.Sprintf("%.2f", m.Reward["format"]), "calls", fmt.Sprintf("%.2f", m.CallsPerQuestion),
			"step_s", fmt.Sprintf("%.1f", m.StepTime), "eta", eta.Round(time.Second).String())
	}
}

func (p *progress) finish() {
	if p.tty {
		fmt.Fprintln(os.Stderr)
	}
}
