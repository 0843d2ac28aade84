package baselines

import "fmt"

// Config is the [baselines] table of recal.toml: one sub-table of
// hyper-parameters per trainable router. A fitted router saves the table it
// was fitted with in its manifest; changing the table means fitting again.
// Every router picks argmax over models of score − cost_lambda · cost, cost
// being the model's mean cost on the outcome matrix divided by the highest
// model's (so cost_lambda is in score units per "most expensive model");
// cost_lambda = 0, the default, routes for quality alone, as the ReCal
// paper's Table 1 compares them.
type Config struct {
	// ValShare is the share of the matrix's questions held out to select
	// each router's weights (select.go): after every epoch the held-out
	// questions are routed and the weights of the best mean
	// F1 − cost_lambda · relative cost of the picks kept. 0 keeps the last
	// epoch's weights.
	ValShare    float64           `toml:"val_share" json:"val_share"`
	MLP         MLPConfig         `toml:"mlp" json:"mlp"`
	RouteLLMMF  MFConfig          `toml:"routellm_mf" json:"routellm_mf"`
	RouterDC    RouterDCConfig    `toml:"routerdc" json:"routerdc"`
	GraphRouter GraphRouterConfig `toml:"graphrouter" json:"graphrouter"`
}

// MLPConfig is [baselines.mlp]: RouterBench's MLP router.
type MLPConfig struct {
	// Hidden is the width of the one hidden (ReLU) layer.
	Hidden int `toml:"hidden" json:"hidden"`
	// Epochs is the passes over the outcome matrix's training questions.
	Epochs int `toml:"epochs" json:"epochs"`
	// BatchSize is the questions per AdamW step.
	BatchSize int `toml:"batch_size" json:"batch_size"`
	// LR is AdamW's learning rate.
	LR float64 `toml:"lr" json:"lr"`
	// WeightDecay is AdamW's decoupled weight decay.
	WeightDecay float64 `toml:"weight_decay" json:"weight_decay"`
	// CostLambda weighs the cost penalty of the choice (see Config).
	CostLambda float64 `toml:"cost_lambda" json:"cost_lambda"`
}

// MFConfig is [baselines.routellm_mf]: RouteLLM's matrix factorisation.
type MFConfig struct {
	// Dim is the size of the model embeddings and of the projected question.
	Dim int `toml:"dim" json:"dim"`
	// Epochs is the passes over the training questions that have a
	// preference pair (two models of different F1).
	Epochs int `toml:"epochs" json:"epochs"`
	// BatchSize is the questions per AdamW step, each with all its
	// preference pairs.
	BatchSize int `toml:"batch_size" json:"batch_size"`
	// LR is AdamW's learning rate.
	LR float64 `toml:"lr" json:"lr"`
	// WeightDecay is AdamW's decoupled weight decay.
	WeightDecay float64 `toml:"weight_decay" json:"weight_decay"`
	// Noise is the standard deviation of the Gaussian noise added to each
	// coordinate of the question embedding in training (RouteLLM's alpha,
	// 0.1 for its 1536-d OpenAI embeddings).
	Noise float64 `toml:"noise" json:"noise"`
	// CostLambda weighs the cost penalty of the choice, in logit units.
	CostLambda float64 `toml:"cost_lambda" json:"cost_lambda"`
}

// RouterDCConfig is [baselines.routerdc]: RouterDC's dual contrastive router.
type RouterDCConfig struct {
	// Hidden is the question encoder's hidden (ReLU) width.
	Hidden int `toml:"hidden" json:"hidden"`
	// Dim is the question encoder's output size, the size of the model
	// embeddings too.
	Dim int `toml:"dim" json:"dim"`
	// Epochs is the passes over the outcome matrix's training questions.
	Epochs int `toml:"epochs" json:"epochs"`
	// BatchSize is the questions per AdamW step.
	BatchSize int `toml:"batch_size" json:"batch_size"`
	// LR is AdamW's learning rate.
	LR float64 `toml:"lr" json:"lr"`
	// WeightDecay is AdamW's decoupled weight decay.
	WeightDecay float64 `toml:"weight_decay" json:"weight_decay"`
	// Temperature τ divides the question–model cosine similarities.
	Temperature float64 `toml:"temperature" json:"temperature"`
	// TopK is the number of models of highest score that are the positives
	// of the sample-LLM loss (clamped to the pool).
	TopK int `toml:"top_k" json:"top_k"`
	// LastK is the number of models of lowest score that are the negatives
	// of the sample-LLM loss (clamped to the pool).
	LastK int `toml:"last_k" json:"last_k"`
	// Clusters is k of the k-means over the training questions' embeddings
	// whose clusters the sample-sample loss contrasts.
	Clusters int `toml:"clusters" json:"clusters"`
	// SampleWeight is λ, the weight of the sample-sample loss (0 = off).
	SampleWeight float64 `toml:"sample_weight" json:"sample_weight"`
	// SampleNegatives is H, the negatives drawn per question from other
	// clusters in the batch for the sample-sample loss.
	SampleNegatives int `toml:"sample_negatives" json:"sample_negatives"`
	// CostLambda weighs the cost penalty of the choice, in units of the
	// softmax probability over models.
	CostLambda float64 `toml:"cost_lambda" json:"cost_lambda"`
}

// GraphRouterConfig is [baselines.graphrouter]: GraphRouter's graph of
// tasks, questions and models.
type GraphRouterConfig struct {
	// Hidden is the size of the aligned task and question features; nodes
	// have 2·Hidden features.
	Hidden int `toml:"hidden" json:"hidden"`
	// Steps is the number of full-graph AdamW steps.
	Steps int `toml:"steps" json:"steps"`
	// MaskRate is the share of training edges hidden from message passing
	// and predicted at each step, in (0, 1).
	MaskRate float64 `toml:"mask_rate" json:"mask_rate"`
	// LR is AdamW's learning rate.
	LR float64 `toml:"lr" json:"lr"`
	// WeightDecay is AdamW's decoupled weight decay.
	WeightDecay float64 `toml:"weight_decay" json:"weight_decay"`
	// CostWeight weighs the cost edge's loss against the performance edge's.
	CostWeight float64 `toml:"cost_weight" json:"cost_weight"`
	// CostLambda weighs the predicted (normalised) cost in the choice:
	// predicted performance − cost_lambda · predicted cost.
	CostLambda float64 `toml:"cost_lambda" json:"cost_lambda"`
}

// DefaultConfig returns the defaults: the papers' settings where they fit a
// pool of a few models and a few thousand questions (see each router's doc).
func DefaultConfig() Config {
	return Config{
		ValShare:   0.1,
		MLP:        MLPConfig{Hidden: 128, Epochs: 30, BatchSize: 64, LR: 1e-3, WeightDecay: 1e-4},
		RouteLLMMF: MFConfig{Dim: 128, Epochs: 30, BatchSize: 64, LR: 3e-3, WeightDecay: 1e-5, Noise: 0.01},
		RouterDC: RouterDCConfig{Hidden: 128, Dim: 64, Epochs: 30, BatchSize: 64, LR: 1e-3, WeightDecay: 1e-4,
			Temperature: 0.2, TopK: 1, LastK: 2, Clusters: 5, SampleWeight: 1, SampleNegatives: 3},
		GraphRouter: GraphRouterConfig{Hidden: 32, Steps: 300, MaskRate: 0.3, LR: 3e-3, WeightDecay: 1e-4, CostWeight: 0.5},
	}
}

// Validate checks every field, naming the bad key.
func (c Config) Validate() error {
	type check struct {
		bad bool
		key string
		val any
		msg string
	}
	m, f, d, g := c.MLP, c.RouteLLMMF, c.RouterDC, c.GraphRouter
	for _, ch := range []check{
		{!(c.ValShare >= 0 && c.ValShare < 1), "val_share", c.ValShare, "in [0, 1)"},
		{m.Hidden < 1, "mlp.hidden", m.Hidden, "≥ 1"},
		{m.Epochs < 1, "mlp.epochs", m.Epochs, "≥ 1"},
		{m.BatchSize < 1, "mlp.batch_size", m.BatchSize, "≥ 1"},
		{!(m.LR > 0), "mlp.lr", m.LR, "> 0"},
		{m.WeightDecay < 0, "mlp.weight_decay", m.WeightDecay, "≥ 0"},
		{m.CostLambda < 0, "mlp.cost_lambda", m.CostLambda, "≥ 0"},
		{f.Dim < 1, "routellm_mf.dim", f.Dim, "≥ 1"},
		{f.Epochs < 1, "routellm_mf.epochs", f.Epochs, "≥ 1"},
		{f.BatchSize < 1, "routellm_mf.batch_size", f.BatchSize, "≥ 1"},
		{!(f.LR > 0), "routellm_mf.lr", f.LR, "> 0"},
		{f.WeightDecay < 0, "routellm_mf.weight_decay", f.WeightDecay, "≥ 0"},
		{f.Noise < 0, "routellm_mf.noise", f.Noise, "≥ 0"},
		{f.CostLambda < 0, "routellm_mf.cost_lambda", f.CostLambda, "≥ 0"},
		{d.Hidden < 1, "routerdc.hidden", d.Hidden, "≥ 1"},
		{d.Dim < 1, "routerdc.dim", d.Dim, "≥ 1"},
		{d.Epochs < 1, "routerdc.epochs", d.Epochs, "≥ 1"},
		{d.BatchSize < 2, "routerdc.batch_size", d.BatchSize, "≥ 2"},
		{!(d.LR > 0), "routerdc.lr", d.LR, "> 0"},
		{d.WeightDecay < 0, "routerdc.weight_decay", d.WeightDecay, "≥ 0"},
		{!(d.Temperature > 0), "routerdc.temperature", d.Temperature, "> 0"},
		{d.TopK < 1, "routerdc.top_k", d.TopK, "≥ 1"},
		{d.LastK < 1, "routerdc.last_k", d.LastK, "≥ 1"},
		{d.Clusters < 2, "routerdc.clusters", d.Clusters, "≥ 2"},
		{d.SampleWeight < 0, "routerdc.sample_weight", d.SampleWeight, "≥ 0"},
		{d.SampleNegatives < 1, "routerdc.sample_negatives", d.SampleNegatives, "≥ 1"},
		{d.CostLambda < 0, "routerdc.cost_lambda", d.CostLambda, "≥ 0"},
		{g.Hidden < 1, "graphrouter.hidden", g.Hidden, "≥ 1"},
		{g.Steps < 1, "graphrouter.steps", g.Steps, "≥ 1"},
		{!(g.MaskRate > 0 && g.MaskRate < 1), "graphrouter.mask_rate", g.MaskRate, "in (0, 1)"},
		{!(g.LR > 0), "graphrouter.lr", g.LR, "> 0"},
		{g.WeightDecay < 0, "graphrouter.weight_decay", g.WeightDecay, "≥ 0"},
		{g.CostWeight < 0, "graphrouter.cost_weight", g.CostWeight, "≥ 0"},
		{g.CostLambda < 0, "graphrouter.cost_lambda", g.CostLambda, "≥ 0"},
	} {
		if ch.bad {
			return fmt.Errorf("baselines: baselines.%s = %v: want %s", ch.key, ch.val, ch.msg)
		}
	}
	return nil
}
