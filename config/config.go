// Package config is recal's one typed configuration, mirrored by recal.toml.
// Defaults live in Default; Load reads a TOML file strictly (an unknown key is
// an error naming it), applies --set overrides by dotted key, and validates.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/recal-project/recal/calibration"
	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/eval/baselines"
	"github.com/recal-project/recal/eval/embed"
	"github.com/recal-project/recal/internal/inputfile"
	"github.com/recal-project/recal/llmpool"
	"github.com/recal-project/recal/router"
)

// Config is the whole configuration. Each table's fields are documented
// where the type is defined.
type Config struct {
	Policy      Policy             `toml:"policy"`
	Data        data.Config        `toml:"data"`
	Pool        llmpool.Config     `toml:"pool"`
	Router      router.Config      `toml:"router"`
	Calibration calibration.Config `toml:"calibration"`
	Train       Train              `toml:"train"`
	PPO         PPO                `toml:"ppo"`
	SFT         SFT                `toml:"sft"`
	Eval        Eval               `toml:"eval"`
	Serve       Serve              `toml:"serve"`
	// Embedding is how the baseline routers embed questions ([embedding]).
	Embedding embed.Config `toml:"embedding"`
	// Baselines holds the trainable baseline routers' hyper-parameters
	// ([baselines.mlp], [baselines.routellm_mf], [baselines.routerdc],
	// [baselines.graphrouter]).
	Baselines baselines.Config `toml:"baselines"`
	// Dist is how the ranks of a data-parallel job talk ([dist]).
	Dist Dist `toml:"dist"`
}

// Train configures GRPO training ([train]). Paper defaults: batch 64,
// group 4, 150 steps, lr 1e-6, temperature 1.0.
type Train struct {
	// Algorithm is the policy-gradient algorithm: "grpo" (ReCal's
	// calibrated group advantages, [calibration]) or "ppo" (Router-R1's PPO:
	// a value head, GAE and Router-R1's reward, [ppo]). The trainer's
	// registry of algorithms is the list of known names (docs/method.md).
	Algorithm string `toml:"algorithm"`
	// Seed fixes the data order and every sampling draw of the run.
	Seed int64 `toml:"seed"`
	// Steps is the number of GRPO steps. A resumed run may change it
	// (continue a shorter run) only while LRSchedule is "constant": a
	// decaying schedule spans the steps.
	Steps int `toml:"steps"`
	// BatchSize is the questions per step (each gets GroupSize responses).
	BatchSize int `toml:"batch_size"`
	// GroupSize is G, the responses sampled per question (≥ 2).
	GroupSize int `toml:"group_size"`
	// MiniBatches splits a step's responses into this many optimizer
	// updates (1 = one update per step, fully on-policy). Each mini-batch
	// takes responses of every group (with mini_batches dividing
	// group_size, responses [m·G/k, (m+1)·G/k) of each), so every
	// data-parallel rank works in every mini-batch.
	MiniBatches int `toml:"mini_batches"`
	// MicroBatch is the responses per forward/backward call; gradients
	// accumulate over the micro-batches of a mini-batch.
	MicroBatch int `toml:"micro_batch"`
	// RolloutRows is the most responses a rank decodes at once in a step's
	// rollouts, each a row of the KV cache (0 = all of the rank's share of
	// batch_size × group_size): more run in consecutive rounds, each with a
	// KV cache of its own. The dry run's memory plan names the largest
	// count that fits the device (docs/memory.md). A response samples the
	// same tokens in any round (float32 on the CPU: the same bits; bfloat16
	// or CUDA: up to float rounding), so it only trades time for memory.
	RolloutRows int `toml:"rollout_rows"`
	// Temperature is the rollouts' sampling temperature (0 = greedy).
	Temperature float64 `toml:"temperature"`
	// TopP is the rollouts' nucleus-sampling mass, in (0, 1] (1 = off).
	TopP float64 `toml:"top_p"`
	// LR is the AdamW learning rate (the peak of LRSchedule).
	LR float64 `toml:"lr"`
	// WeightDecay is AdamW's decoupled weight decay λ: each update first
	// multiplies the weights by 1 − lr·λ.
	WeightDecay float64 `toml:"weight_decay"`
	// Beta1 is AdamW's first-moment decay β₁, in [0, 1).
	Beta1 float64 `toml:"beta1"`
	// Beta2 is AdamW's second-moment decay β₂, in [0, 1).
	Beta2 float64 `toml:"beta2"`
	// AdamEps is AdamW's ε, added to the square root of the second moment.
	AdamEps float64 `toml:"adam_eps"`
	// LRSchedule is how the learning rate of a GRPO step follows from LR
	// after the warm-up: "constant" (LR), "linear" (decays linearly towards
	// MinLRRatio·LR) or "cosine" (a half cosine towards MinLRRatio·LR); see
	// Train.LRFactor for the exact formula. ppo.value_lr is scaled alike.
	LRSchedule string `toml:"lr_schedule"`
	// WarmupSteps ramps the learning rate linearly over the first this many
	// GRPO steps: LR·s/WarmupSteps at step s (0 = no warm-up). A run of
	// WarmupSteps steps or fewer (a short try with --set train.steps=N)
	// ends inside the ramp.
	WarmupSteps int `toml:"warmup_steps"`
	// MinLRRatio is the fraction of LR the "linear" and "cosine" schedules
	// decay towards, in [0, 1] (0 = towards zero; ignored by "constant").
	MinLRRatio float64 `toml:"min_lr_ratio"`
	// MaxGradNorm clips the global gradient norm (≤ 0: off).
	MaxGradNorm float64 `toml:"max_grad_norm"`
	// ClipEps is the PPO ratio clip ε.
	ClipEps float64 `toml:"clip_eps"`
	// KLCoef weighs GRPO's k3 KL penalty to the frozen starting policy in
	// the loss; 0 keeps no reference policy in memory. Algorithm "ppo" does
	// not read it: its KL is in the reward, weighed by ppo.kl_coef.
	KLCoef float64 `toml:"kl_coef"`
	// EntropyCoef weighs an entropy bonus (0 = none).
	EntropyCoef float64 `toml:"entropy_coef"`
	// NoRepeatNGram is router.no_repeat_ngram for the training rollouts
	// (0 = off); router.no_repeat_ngram itself applies to validation,
	// evaluation and serving. They differ in the offline default: a policy
	// trained with the ban leaned on it (its derailed copies looped in
	// triples, "talk talk talk", which a 3-gram ban allows) and was
	// well-formed less often at evaluation than one trained without it.
	NoRepeatNGram int `toml:"no_repeat_ngram"`
	// ModelSubsets is the share, in [0, 1], of training questions whose
	// GRPO (or PPO) prompt lists a random non-empty subset of the pool in a
	// random order instead of every model in the pool's order; the
	// question's responses may call only the listed models (a <search>
	// naming another is an unknown model: a failure observation, no call,
	// not well formed), as `recal serve` treats a model outside a request's
	// recal.models. The draw (a size uniform in 1..K, then the members and
	// their order) is a pure function of (train.seed, step, question id),
	// so the G responses of a group share it and data-parallel ranks,
	// rollout workers and --resume give the same run bit for bit. The
	// [sft] warm-up's demonstrations draw the same way (with the warm-up
	// step for the step) and call a model of their list. 0 = off (every
	// prompt lists the full pool, as before the key). Validation,
	// evaluation and serving's unrestricted requests always list the full
	// pool. The load-balance counts stay over the whole pool
	// (docs/training.md, "Model subsets").
	ModelSubsets float64 `toml:"model_subsets"`
	// EMADecay is α of the load-balance reward's routing counts.
	EMADecay float64 `toml:"ema_decay"`
	// CheckpointEvery saves checkpoints/step-N every this many steps (and at
	// the end and on interruption).
	CheckpointEvery int `toml:"checkpoint_every"`
	// ValidateEvery runs validation on the held-out questions every this
	// many steps (0 = only at the end).
	ValidateEvery int `toml:"validate_every"`
	// KeepBest keeps the checkpoint of the validation with the highest mean
	// F1 over the validation datasets, each response that is not well formed
	// scored 0, as checkpoints/best (a validation that improves on the best
	// so far makes its step a checkpoint).
	KeepBest bool `toml:"keep_best"`
	// HeadChunk is the tokens per output-head chunk in the loss (bounds the
	// [chunk, vocab] logits in memory).
	HeadChunk int `toml:"head_chunk"`
	// LogEvery is the seconds between progress lines when stderr is not a terminal.
	LogEvery float64 `toml:"log_every"`
	// ResetOptimizerAfterSFT starts GRPO with a fresh AdamW (zero moments,
	// step 0), as a separate RL job would, instead of the warm-up's state.
	ResetOptimizerAfterSFT bool `toml:"reset_optimizer_after_sft"`
	// MaxSkippedUpdates stops the run with an error after this many
	// consecutive optimizer updates skipped for a non-finite gradient norm
	// (0 = never stop; skips are still counted and logged).
	MaxSkippedUpdates int `toml:"max_skipped_updates"`
}

// PPO configures train.algorithm = "ppo" ([ppo], read only then): Router-R1's
// PPO with a critic, here a value head on the policy's own trunk, GAE over
// the response's policy tokens and Router-R1's reward (docs/method.md,
// "PPO"). Defaults are Router-R1's (verl's) settings where it has them.
type PPO struct {
	// Gamma is GAE's discount γ per policy token (Router-R1: 1.0).
	Gamma float64 `toml:"gamma"`
	// Lam is GAE's λ (Router-R1: 1.0).
	Lam float64 `toml:"lam"`
	// VFCoef weighs the value loss in the one loss that trains the policy
	// and the value head on their shared trunk (Router-R1's critic is a
	// separate model; 0.1 is TRL's shared-trunk default).
	VFCoef float64 `toml:"vf_coef"`
	// ValueClip is ε_v of the clipped value loss, around the values the
	// batch was scored with (verl's cliprange_value, 0.5; 0 = no clip).
	ValueClip float64 `toml:"value_clip"`
	// ValueLR is the value head's learning rate (Router-R1's critic: 1e-5,
	// ten times the actor's); 0 = train.lr.
	ValueLR float64 `toml:"value_lr"`
	// WhitenAdvantages standardises the token advantages over the step's
	// batch (verl's masked_whiten).
	WhitenAdvantages bool `toml:"whiten_advantages"`
	// Outcome is the answer score of the reward: "f1" (Router-R1's
	// RewardManager default) or "em" (what its train.sh passes).
	Outcome string `toml:"outcome"`
	// CostCoef is Router-R1's α: a well-formed response with a right answer
	// earns (1−α)·outcome + α·c, c ∈ [0, 1] the cheapness of its pool calls
	// (1 − their √cost normalised over the last CostWindow responses); 0 =
	// no cost term (Router-R1's train.sh).
	CostCoef float64 `toml:"cost_coef"`
	// CostWindow is the number of recent responses whose √cost sets the
	// normalisation (Router-R1: 1000).
	CostWindow int `toml:"cost_window"`
	// KLCoef is β of the in-reward KL penalty: −β·(log π_old − log π_ref)
	// on every policy token's reward, and no KL term in the loss (verl's
	// use_kl_in_reward); 0 keeps no reference policy in memory. The default
	// is Router-R1's: its train.sh sets algorithm.kl_ctrl.kl_coef=0.001.
	// PPO does not read train.kl_coef, GRPO's KL weight in the loss.
	KLCoef float64 `toml:"kl_coef"`
}

// KLCoef is β of the configured algorithm's KL penalty to the frozen
// starting policy: ppo.kl_coef under train.algorithm "ppo" (in the reward),
// else train.kl_coef (in GRPO's loss). A run keeps that reference policy in
// memory when it is > 0.
func (c Config) KLCoef() float64 { return klCoef(c.Train, c.PPO) }

func klCoef(t Train, p PPO) float64 {
	if t.Algorithm == "ppo" {
		return p.KLCoef
	}
	return t.KLCoef
}

// DefaultPPO returns the [ppo] defaults.
func DefaultPPO() PPO {
	return PPO{Gamma: 1, Lam: 1, VFCoef: 0.1, ValueClip: 0.5, WhitenAdvantages: true, Outcome: "f1", CostWindow: 1000, KLCoef: 0.001}
}

// Validate checks the [ppo] table, naming the bad key.
func (p PPO) Validate() error {
	checks := []struct {
		bad bool
		msg string
	}{
		{p.Gamma < 0 || p.Gamma > 1, fmt.Sprintf("ppo.gamma = %g: must be in [0, 1]", p.Gamma)},
		{p.Lam < 0 || p.Lam > 1, fmt.Sprintf("ppo.lam = %g: must be in [0, 1]", p.Lam)},
		{p.VFCoef < 0, fmt.Sprintf("ppo.vf_coef = %g: must be ≥ 0", p.VFCoef)},
		{p.ValueClip < 0, fmt.Sprintf("ppo.value_clip = %g: must be ≥ 0 (0 = no clip)", p.ValueClip)},
		{p.ValueLR < 0, fmt.Sprintf("ppo.value_lr = %g: must be ≥ 0 (0 = train.lr)", p.ValueLR)},
		{p.Outcome != "f1" && p.Outcome != "em", fmt.Sprintf("ppo.outcome = %q: want \"f1\" or \"em\"", p.Outcome)},
		{p.CostCoef < 0 || p.CostCoef > 1, fmt.Sprintf("ppo.cost_coef = %g: must be in [0, 1]", p.CostCoef)},
		{p.CostWindow < 1, fmt.Sprintf("ppo.cost_window = %d: must be ≥ 1", p.CostWindow)},
		{p.KLCoef < 0, fmt.Sprintf("ppo.kl_coef = %g: must be ≥ 0 (0 = no KL penalty)", p.KLCoef)},
	}
	for _, ch := range checks {
		if ch.bad {
			return fmt.Errorf("%s", ch.msg)
		}
	}
	return nil
}

// SFT configures the supervised warm-up on format demonstrations ([sft]):
// for training questions, a demonstration calls a pool model (the sim pool
// offline) with the question and answers with the reply's answer. Steps 0
// skips the stage.
type SFT struct {
	// Steps of the warm-up (0 skips it).
	Steps int `toml:"steps"`
	// BatchSize is the demonstrations per step.
	BatchSize int `toml:"batch_size"`
	// LR is the peak learning rate; it decays linearly to zero over Steps.
	LR float64 `toml:"lr"`
	// CorrectOnly keeps only demonstrations whose answer matches a golden answer.
	CorrectOnly bool `toml:"correct_only"`
	// AnswerWeight weighs the loss of the answer turn's tokens against the
	// other policy tokens (1 = plain token mean). Copying the answer out of
	// <information> is the hardest thing a policy trained from scratch
	// learns in the warm-up.
	AnswerWeight float64 `toml:"answer_weight"`
	// Route is the route the demonstrations take (trainer.DemoRoutes):
	// "uniform" calls one pool model drawn uniformly and answers from its
	// reply (the protocol's shape, no routing taught); "agree" asks the
	// models of Chain in order, answers as soon as the latest reply's
	// answer agrees with an earlier reply, and otherwise asks the next
	// (the last answers): a cheap model first, escalation when the
	// replies disagree (docs/method.md, "The warm-up").
	Route string `toml:"route"`
	// Chain are the pool models the "agree" route asks, in order (2 to
	// router.max_turns of them, each at most once).
	Chain []string `toml:"chain"`
	// DecisionWeight (> 0, the "agree" route) weighs the first token of
	// each turn after a reply: the choice between answering and asking
	// again, one token among the demonstration's many; 0 leaves it its
	// turn's weight.
	DecisionWeight float64 `toml:"decision_weight"`
	// BudgetShare (0 to 1, the "agree" route) is the share of
	// demonstrations cut by a spent cost budget: after its first reply, or
	// (when it asked more than two models) after one of its first two drawn
	// at random, the next call is refused as a spent per-request budget
	// refuses it (router.BudgetText, no reply) and the demonstration
	// answers from the last reply it got. It teaches the policy to answer
	// well under a budget (serve's recal.max_cost_usd, frontier's
	// --budgets), which it never meets otherwise. 0 = none.
	BudgetShare float64 `toml:"budget_share"`
}

// Eval configures evaluation ([eval]).
type Eval struct {
	// Batch is the questions decoded together.
	Batch int `toml:"batch"`
}

// Policy says which checkpoint the routing policy starts from and where it runs.
type Policy struct {
	// Checkpoint is the Hugging Face folder (config.json, model.safetensors,
	// tokenizer.json) the policy is loaded from. Relative paths are resolved
	// against the config file's folder (against the working directory when
	// given with --set), as are data.dir, pool.cache_dir and
	// router.prompt_template.
	Checkpoint string `toml:"checkpoint"`
	// Device is "cpu", "cuda" or "cuda:N" (cuda needs a CUDA libtorch, see
	// LIBTORCH). With several data-parallel ranks "cuda" gives each rank
	// cuda:LOCAL_RANK, and "cuda:N" is refused (every rank of a node on
	// one GPU).
	Device string `toml:"device"`
	// DType is the parameter and compute precision: "float32" or "bfloat16".
	DType string `toml:"dtype"`
	// Threads is the number of CPU threads libtorch uses (0 = all cores).
	Threads int `toml:"threads"`
	// DecodeThreads is the number of CPU threads while the policy decodes
	// (GRPO rollouts, validation, the policy's answers in eval, table1 and
	// ablate, and the whole of serve; 0 = Threads). A small policy decodes a few rows per
	// step, too little work to share: on the 2-core VM the tiny policy's
	// rollouts ran 1.26× faster on one thread than on two. Training's
	// forward and backward passes keep Threads. Another thread count can
	// round a rollout's log-probabilities differently in the last bit
	// (once in 20 GRPO steps of the tiny policy), so a resume may not
	// change it.
	DecodeThreads int `toml:"decode_threads"`
	// RolloutWorkers is the number of OS threads that decode a training
	// rollout's rows at once (GRPO and PPO), each on one libtorch thread,
	// when the rollouts decode on one thread (decode_threads = 1) on the
	// CPU, at most one per core; 0 = the job's libtorch thread count
	// (threads, shared among the ranks on a machine), 1 = none. With log-probs asked for, a row's result does
	// not depend on the rows sharing its decode call, so the count changes
	// no bit of a run, only its speed: on the 2-core VM the tiny policy's
	// rollouts, which leave one core idle on one thread, ran about 1.4x
	// faster with 2 in make train (1.75x in make bench's 256-row rollout).
	RolloutWorkers int `toml:"rollout_workers"`
	// GradientCheckpointing recomputes each decoder layer's activations in
	// the backward instead of keeping them from the forward (activation
	// checkpointing): the trunk then holds one layer's activations at a
	// time (and each layer's input) for about one more forward pass of
	// compute. The gradients are the plain backward's, bit for bit.
	GradientCheckpointing bool `toml:"gradient_checkpointing"`
	// ReloadReference loads the KL reference (train.kl_coef or ppo.kl_coef
	// > 0) from its checkpoint for each step's scoring and frees it after,
	// instead of keeping it in memory for the whole run: a rank then holds
	// no copy of the reference during the rollout and the update, for one
	// read of the checkpoint a step (from the page cache after the first).
	// The same log-probs, bit for bit. A checkpoint folder that changes
	// during the run (its files' sizes or times) fails the step.
	ReloadReference bool `toml:"reload_reference"`
	// EagerDecode launches every kernel of a GPU decode step from the host
	// instead of replaying the step as a CUDA graph (docs/results/gpu.md): for
	// comparison or debugging. No effect on the CPU.
	EagerDecode bool `toml:"eager_decode"`
	// DeviceMemory is the memory of the device each rank's policy runs on,
	// in GiB, against which the dry runs (train, eval and serve --dry-run)
	// check their memory plan (docs/memory.md): a GPU's memory, e.g. 80
	// for an 80 GB card. 0: the machine's MemTotal for device "cpu" (shared
	// by the ranks of a job on it); for a GPU its memory as CUDA reports it,
	// read by the dry run (unknown, the plan printed without a verdict, in a
	// build without CUDA or where no GPU answers). Nothing else reads it.
	DeviceMemory float64 `toml:"device_memory"`
}

// Default returns the configuration every file starts from.
func Default() Config {
	return Config{
		Policy:      Policy{Checkpoint: "runs/init/tiny", Device: "cpu", DType: "float32"},
		Data:        data.DefaultConfig(),
		Pool:        llmpool.Defaults(),
		Router:      router.DefaultConfig(),
		Calibration: calibration.DefaultConfig(),
		PPO:         DefaultPPO(),
		Train: Train{Steps: 150, BatchSize: 64, GroupSize: 4, MiniBatches: 1, MicroBatch: 16, Temperature: 1, TopP: 1,
			LR: 1e-6, LRSchedule: "constant", WeightDecay: 0.01, Beta1: 0.9, Beta2: 0.999, AdamEps: 1e-8, MaxGradNorm: 1, ClipEps: 0.2,
			KLCoef: 0.001, EMADecay: 0.9, CheckpointEvery: 25, ValidateEvery: 25, HeadChunk: 1024, LogEvery: 10,
			ResetOptimizerAfterSFT: true, MaxSkippedUpdates: 3, Algorithm: "grpo", KeepBest: true},
		SFT:       SFT{Steps: 0, BatchSize: 16, LR: 1e-4, AnswerWeight: 1, Route: "uniform"},
		Eval:      Eval{Batch: 64},
		Serve:     DefaultServe(),
		Embedding: embed.DefaultConfig(),
		Baselines: baselines.DefaultConfig(),
		Dist:      DefaultDist(),
	}
}

// Load reads path over the defaults, applies sets ("key.sub=value", TOML
// values; bare words are strings) and validates. Relative paths in the file
// (and the defaults of path keys it leaves out) are resolved against the
// file's folder; a relative path given by a set is taken relative to the
// working directory, as any command-line path is; a replayed pool model's
// replay.log is resolved against the file's folder too. Load reads no other
// file: checking a replayed model's log against [data] is the commands'
// preflight step (cmd/recal/internal/preflight, Replay).
func Load(path string, sets []string) (Config, error) {
	b, err := inputfile.ReadFile(path, inputfile.ConfigLimit)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	cfg, err := Parse(path, b, sets)
	if err != nil {
		return Config{}, err
	}
	fromSet := map[string]bool{}
	for _, s := range sets {
		key, _, _ := strings.Cut(s, "=")
		fromSet[strings.TrimSpace(key)] = true
	}
	cfg.resolve(filepath.Dir(path), fromSet)
	return cfg, nil
}

// Parse decodes TOML text (name is used in errors) with overrides. An error
// about a value names where the value came from: the file and its line, or
// the --set flag and its value.
func Parse(name string, text []byte, sets []string) (Config, error) {
	tree := map[string]any{}
	if _, err := toml.Decode(string(text), &tree); err != nil {
		return Config{}, fmt.Errorf("config: %s: %w", name, err)
	}
	// The file alone into the typed struct: a value of the wrong type is
	// reported at its own line (the merged text below has other lines).
	fileOnly := Default()
	if _, err := toml.Decode(string(text), &fileOnly); err != nil {
		return Config{}, fmt.Errorf("config: %s: %w", name, err)
	}
	setKeys := map[string]string{} // dotted key → its --set flag
	for _, s := range sets {
		if err := applySet(tree, s); err != nil {
			return Config{}, fmt.Errorf("config: --set %s: %w", s, err)
		}
		if err := checkSet(s); err != nil {
			return Config{}, fmt.Errorf("config: --set %s: %w", s, err)
		}
		key, _, _ := strings.Cut(s, "=")
		setKeys[strings.TrimSpace(key)] = s
	}
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(tree); err != nil {
		return Config{}, fmt.Errorf("config: %s: %w", name, err)
	}
	cfg := Default()
	md, err := toml.Decode(buf.String(), &cfg)
	if err != nil {
		return Config{}, fmt.Errorf("config: %s: %w", name, err)
	}
	cfg.Pool.SetDefaults() // per-model provider defaults (top_p, timeouts, …)
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		sort.Strings(keys)
		return Config{}, fmt.Errorf("config: %s: unknown key %q", blame(name, keys[0], setKeys), keys[0])
	}
	if err := checkFinite(reflect.ValueOf(cfg), ""); err != nil {
		return Config{}, fmt.Errorf("config: %s: %w", blame(name, err.Error(), setKeys), err)
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("config: %s: %w", blame(name, err.Error(), setKeys), err)
	}
	return cfg, nil
}

// blame is where the value an error message is about came from: the --set
// flag of the key the message starts with, else the file name.
func blame(name, msg string, setKeys map[string]string) string {
	best := ""
	for key, set := range setKeys {
		if (msg == key || strings.HasPrefix(msg, key+" ") || strings.HasPrefix(msg, key+".") || strings.HasPrefix(msg, key+"[")) && len(key) > len(best) {
			best, name = key, "--set "+set
		}
	}
	return name
}

// checkSet decodes one --set override alone into the typed struct, so that a
// value of the wrong type (train.steps=1e30, train.lr=fast) is blamed on the
// flag, not on a line of the file.
func checkSet(set string) error {
	one := map[string]any{}
	if err := applySet(one, set); err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(one); err != nil {
		return err
	}
	cfg := Default()
	if _, err := toml.Decode(buf.String(), &cfg); err != nil {
		// "toml: line 2 (last key "train.lr"): …": the line is of the
		// text made from the flag, meaningless to the user.
		msg := tomlLine.ReplaceAllString(err.Error(), "key $1: ")
		_, val, _ := strings.Cut(set, "=")
		var v map[string]any
		if _, perr := toml.Decode("v = "+val, &v); perr != nil {
			msg += fmt.Sprintf(" (%s is not a TOML value, so it was read as a string)", strings.TrimSpace(val))
		}
		return errors.New(msg)
	}
	return nil
}

// tomlLine matches the position prefix of a TOML decoding error.
var tomlLine = regexp.MustCompile(`^toml: (?:line \d+ )?\(last key ("[^"]*")\): `)

// applySet sets a dotted key in the decoded tree. The value is parsed as a
// TOML value; if that fails it is taken as a string.
func applySet(tree map[string]any, set string) error {
	key, val, ok := strings.Cut(set, "=")
	key = strings.TrimSpace(key)
	if !ok || key == "" {
		return fmt.Errorf("want key=value")
	}
	var v map[string]any
	if _, err := toml.Decode("v = "+val, &v); err != nil {
		v = map[string]any{"v": val}
	}
	parts := strings.Split(key, ".")
	node := tree
	for _, p := range parts[:len(parts)-1] {
		next, ok := node[p].(map[string]any)
		if !ok {
			if _, exists := node[p]; exists {
				return fmt.Errorf("key %q is not a table", p)
			}
			next = map[string]any{}
			node[p] = next
		}
		node = next
	}
	node[parts[len(parts)-1]] = v["v"]
	return nil
}

// Validate checks every field, naming the bad key.
func (c *Config) Validate() error {
	switch c.Policy.DType {
	case "float32", "bfloat16":
	default:
		return fmt.Errorf("policy.dtype = %q: want \"float32\" or \"bfloat16\"", c.Policy.DType)
	}
	if c.Policy.Device != "cpu" && c.Policy.Device != "cuda" && !strings.HasPrefix(c.Policy.Device, "cuda:") {
		return fmt.Errorf("policy.device = %q: want \"cpu\", \"cuda\" or \"cuda:N\"", c.Policy.Device)
	}
	if c.Policy.Threads < 0 {
		return fmt.Errorf("policy.threads = %d: must be ≥ 0", c.Policy.Threads)
	}
	if c.Policy.DeviceMemory < 0 || math.IsNaN(c.Policy.DeviceMemory) || math.IsInf(c.Policy.DeviceMemory, 0) {
		return fmt.Errorf("policy.device_memory = %g: must be a finite number of GiB ≥ 0 (0 = the machine's MemTotal on the CPU, the card's memory as read on a GPU)", c.Policy.DeviceMemory)
	}
	if c.Policy.RolloutWorkers < 0 {
		return fmt.Errorf("policy.rollout_workers = %d: must be ≥ 0", c.Policy.RolloutWorkers)
	}
	if c.Policy.DecodeThreads < 0 {
		return fmt.Errorf("policy.decode_threads = %d: must be ≥ 0", c.Policy.DecodeThreads)
	}
	if c.Policy.Checkpoint == "" {
		return fmt.Errorf("policy.checkpoint is empty")
	}
	if err := c.Data.Validate(); err != nil {
		return err
	}
	if err := c.Pool.Validate(); err != nil {
		return err
	}
	if err := c.Router.Validate(); err != nil {
		return err
	}
	if err := c.Calibration.Validate(); err != nil {
		return err
	}
	if err := c.Serve.Validate(); err != nil {
		return err
	}
	if err := c.Embedding.Validate(); err != nil {
		return err
	}
	if err := c.Baselines.Validate(); err != nil {
		return err
	}
	if err := c.PPO.Validate(); err != nil {
		return err
	}
	if err := c.Dist.Validate(); err != nil {
		return err
	}
	if c.Dist.ShardGradients && c.Policy.Device != "cpu" {
		return fmt.Errorf("dist.shard_gradients = true: sharded gradients give their memory back on the CPU only, and policy.device = %q", c.Policy.Device)
	}
	t := c.Train
	checks := []struct {
		bad bool
		msg string
	}{
		{t.Steps < 0, fmt.Sprintf("train.steps = %d: must be ≥ 0", t.Steps)},
		{t.BatchSize < 1, fmt.Sprintf("train.batch_size = %d: must be ≥ 1", t.BatchSize)},
		{t.GroupSize < 1 || t.GroupSize < 2 && t.Algorithm != "ppo", fmt.Sprintf("train.group_size = %d: GRPO needs at least 2 responses per question (PPO at least 1)", t.GroupSize)},
		{t.MiniBatches < 1 || t.MiniBatches > t.BatchSize*t.GroupSize, fmt.Sprintf("train.mini_batches = %d: must be in [1, batch_size·group_size]", t.MiniBatches)},
		{t.MicroBatch < 1, fmt.Sprintf("train.micro_batch = %d: must be ≥ 1", t.MicroBatch)},
		{t.NoRepeatNGram < 0 || t.NoRepeatNGram == 1, fmt.Sprintf("train.no_repeat_ngram = %d: must be 0 (off) or ≥ 2", t.NoRepeatNGram)},
		{t.Temperature < 0, fmt.Sprintf("train.temperature = %g: must be ≥ 0", t.Temperature)},
		{t.TopP <= 0 || t.TopP > 1, fmt.Sprintf("train.top_p = %g: must be in (0, 1]", t.TopP)},
		{t.LR <= 0, fmt.Sprintf("train.lr = %g: must be > 0", t.LR)},
		{lrDecays[t.LRSchedule] == nil, fmt.Sprintf("train.lr_schedule = %q: want one of %s", t.LRSchedule, strings.Join(LRSchedules(), ", "))},
		{t.WarmupSteps < 0, fmt.Sprintf("train.warmup_steps = %d: must be ≥ 0", t.WarmupSteps)},
		{t.MinLRRatio < 0 || t.MinLRRatio > 1, fmt.Sprintf("train.min_lr_ratio = %g: must be in [0, 1]", t.MinLRRatio)},
		{t.WeightDecay < 0, fmt.Sprintf("train.weight_decay = %g: must be ≥ 0", t.WeightDecay)},
		{t.Beta1 < 0 || t.Beta1 >= 1 || t.Beta2 < 0 || t.Beta2 >= 1, "train.beta1 and train.beta2 must be in [0, 1)"},
		{t.AdamEps <= 0, "train.adam_eps must be > 0"},
		{t.ClipEps <= 0 || t.ClipEps >= 1, fmt.Sprintf("train.clip_eps = %g: must be in (0, 1)", t.ClipEps)},
		{t.KLCoef < 0, "train.kl_coef must be ≥ 0"},
		{!(t.ModelSubsets >= 0 && t.ModelSubsets <= 1), fmt.Sprintf("train.model_subsets = %g: must be a share in [0, 1] (0 = every prompt lists the full pool)", t.ModelSubsets)},
		{t.EMADecay < 0 || t.EMADecay > 1, fmt.Sprintf("train.ema_decay = %g: must be in [0, 1]", t.EMADecay)},
		{t.CheckpointEvery < 1, "train.checkpoint_every must be ≥ 1"},
		{t.ValidateEvery < 0, "train.validate_every must be ≥ 0"},
		{t.HeadChunk < 1, "train.head_chunk must be ≥ 1"},
		{t.RolloutRows < 0, fmt.Sprintf("train.rollout_rows = %d: must be ≥ 0 (0 = all of a rank's responses at once)", t.RolloutRows)},
		{t.MaxSkippedUpdates < 0, fmt.Sprintf("train.max_skipped_updates = %d: must be ≥ 0 (0 = never stop)", t.MaxSkippedUpdates)},
		{c.SFT.Steps < 0, "sft.steps must be ≥ 0"},
		{c.SFT.Steps > 0 && c.SFT.BatchSize < 1, "sft.batch_size must be ≥ 1"},
		{c.SFT.Steps > 0 && c.SFT.LR <= 0, "sft.lr must be > 0"},
		{c.SFT.Steps > 0 && c.SFT.AnswerWeight <= 0, "sft.answer_weight must be > 0"},
		{c.SFT.DecisionWeight < 0, fmt.Sprintf("sft.decision_weight = %g: must be ≥ 0 (0 = the turn's weight)", c.SFT.DecisionWeight)},
		{c.SFT.DecisionWeight > 0 && c.SFT.Route != "agree", fmt.Sprintf("sft.decision_weight = %g: only the \"agree\" route reads it (sft.route = %q)", c.SFT.DecisionWeight, c.SFT.Route)},
		{!(c.SFT.BudgetShare >= 0 && c.SFT.BudgetShare <= 1), fmt.Sprintf("sft.budget_share = %g: must be in [0, 1]", c.SFT.BudgetShare)},
		{c.SFT.BudgetShare > 0 && c.SFT.Route != "agree", fmt.Sprintf("sft.budget_share = %g: only the \"agree\" route reads it (sft.route = %q)", c.SFT.BudgetShare, c.SFT.Route)},
		{c.Eval.Batch < 1, "eval.batch must be ≥ 1"},
	}
	for _, ch := range checks {
		if ch.bad {
			return fmt.Errorf("%s", ch.msg)
		}
	}
	return c.SFT.validateRoute(c.Pool, c.Router.MaxTurns, c.Train.ModelSubsets)
}

// DemoRoutes are the warm-up's demonstration routes (sft.route), built by
// package trainer.
var DemoRoutes = []string{"uniform", "agree"}

// validateRoute checks sft.route and sft.chain against the pool and the
// turn limit.
func (s SFT) validateRoute(pool llmpool.Config, maxTurns int, subsets float64) error {
	if !slices.Contains(DemoRoutes, s.Route) {
		return fmt.Errorf("sft.route = %q: want one of %s", s.Route, strings.Join(DemoRoutes, ", "))
	}
	if s.Route != "agree" {
		if len(s.Chain) > 0 {
			return fmt.Errorf("sft.chain is set, but sft.route = %q does not read it (only \"agree\" does)", s.Route)
		}
		return nil
	}
	if len(s.Chain) < 2 || len(s.Chain) > maxTurns {
		return fmt.Errorf("sft.chain = %q: the \"agree\" route asks 2 to router.max_turns (%d) models", s.Chain, maxTurns)
	}
	for i, m := range s.Chain {
		if !slices.ContainsFunc(pool.Models, func(pm llmpool.ModelConfig) bool { return pm.Name == m }) {
			return fmt.Errorf("sft.chain[%d] = %q: no such pool model", i, m)
		}
		if slices.Index(s.Chain, m) != i {
			return fmt.Errorf("sft.chain[%d] = %q: asked twice", i, m)
		}
	}
	if subsets > 0 {
		return fmt.Errorf("sft.route = \"agree\" with train.model_subsets = %g: the chain's models must be in every prompt (set model_subsets = 0)", subsets)
	}
	return nil
}

// pathFields are the keys whose values are file paths, in a fixed order.
// data.files entries are relative to data.dir and resolved by package data.
func (c *Config) pathFields() []struct {
	key string
	p   *string
} {
	return []struct {
		key string
		p   *string
	}{
		{"policy.checkpoint", &c.Policy.Checkpoint},
		{"data.dir", &c.Data.Dir},
		{"pool.cache_dir", &c.Pool.CacheDir},
		{"router.prompt_template", &c.Router.PromptTemplate},
	}
}

// PathKeys lists the dotted keys whose values are file paths; a relative one
// in a config file is resolved against the file's folder.
func PathKeys() []string {
	var c Config
	var keys []string
	for _, f := range c.pathFields() {
		keys = append(keys, f.key)
	}
	return keys
}

// Path returns the value of a path key (see PathKeys), as resolved by Load.
func (c *Config) Path(key string) (string, bool) {
	for _, f := range c.pathFields() {
		if f.key == key {
			return *f.p, true
		}
	}
	return "", false
}

// resolve joins dir to the relative paths of the config, except those of the
// keys in skip (set on the command line: relative to the working directory).
func (c *Config) resolve(dir string, skip map[string]bool) {
	for _, f := range c.pathFields() {
		if *f.p != "" && !filepath.IsAbs(*f.p) && !skip[f.key] {
			*f.p = filepath.Join(dir, *f.p)
		}
	}
	for i := range c.Pool.Models {
		if r := c.Pool.Models[i].Replay; r != nil && r.Log != "" && !filepath.IsAbs(r.Log) {
			r.Log = filepath.Join(dir, r.Log)
		}
	}
}

// Write encodes the resolved configuration (every key) as TOML.
func (c *Config) Write(path string) error {
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(c); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

// Diff lists the dotted keys whose values differ between two configurations
// as Write encodes them (a list, such as pool.models, counts as one value).
func Diff(a, b Config) ([]string, error) {
	ta, err := a.tree()
	if err != nil {
		return nil, err
	}
	tb, err := b.tree()
	if err != nil {
		return nil, err
	}
	var out []string
	var walk func(prefix string, x, y map[string]any)
	walk = func(prefix string, x, y map[string]any) {
		keys := map[string]bool{}
		for k := range x {
			keys[k] = true
		}
		for k := range y {
			keys[k] = true
		}
		for k := range keys {
			xm, xok := x[k].(map[string]any)
			ym, yok := y[k].(map[string]any)
			switch {
			case xok && yok:
				walk(prefix+k+".", xm, ym)
			case !reflect.DeepEqual(x[k], y[k]):
				out = append(out, prefix+k)
			}
		}
	}
	walk("", ta, tb)
	sort.Strings(out)
	return out, nil
}

// Rollout is what a policy's routing environment reads of the whole
// configuration (internal/rollout's NewEnv and Open): the pool, the
// protocol, and how the policy is opened and decodes.
type Rollout struct {
	Pool   llmpool.Config
	Router router.Config
	Policy Policy
}

// Rollout returns the routing environment's part of c.
func (c Config) Rollout() Rollout {
	return Rollout{Pool: c.Pool, Router: c.Router, Policy: c.Policy}
}

// Training is what a training run reads (trainer.Train): the tables that
// decide what it computes and how, and the whole configuration as the
// Record the run keeps in its folder. Evaluation's, serving's and the
// baseline routers' tables are not among them: a run never reads them.
type Training struct {
	Policy      Policy
	Data        data.Config
	Pool        llmpool.Config
	Router      router.Config
	Calibration calibration.Config
	Train       Train
	PPO         PPO
	SFT         SFT
	Dist        Dist
	// EvalBatch is eval.batch: the questions validation decodes at once.
	EvalBatch int
	// Record is the whole configuration, which the run writes into its
	// folder (config.toml) and which a resume compares with the run's.
	Record Record
}

// Record is a whole configuration as a run keeps it: the trainer writes it
// and compares it with a run's file, and reads none of its keys.
type Record interface {
	// Write writes every key as TOML to path.
	Write(path string) error
	// ChangesFrom lists the keys whose values differ from the configuration
	// file of a run at path, but the ones a resume may change
	// (OperationalKeys).
	ChangesFrom(path string) ([]Change, error)
}

// Training returns the part of c a training run reads, with c as its Record.
func (c Config) Training() Training {
	return Training{Policy: c.Policy, Data: c.Data, Pool: c.Pool, Router: c.Router, Calibration: c.Calibration,
		Train: c.Train, PPO: c.PPO, SFT: c.SFT, Dist: c.Dist, EvalBatch: c.Eval.Batch, Record: &c}
}

// Rollout returns the routing environment's part of t.
func (t Training) Rollout() Rollout {
	return Rollout{Pool: t.Pool, Router: t.Router, Policy: t.Policy}
}

// KLCoef is the KL weight of the algorithm t trains with (Config.KLCoef).
func (t Training) KLCoef() float64 { return klCoef(t.Train, t.PPO) }
