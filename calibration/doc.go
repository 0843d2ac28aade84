// Package calibration turns one training step's raw per-response rewards into
// ReCal's calibrated advantages Â, the numbers the GRPO loss multiplies every
// policy token of a response by.
//
// A response's rewards are the paper's five components (ans, info, format,
// route, balance) and a sixth, cost, that the paper does not have; its
// weight is 0 by default, and at 0 every advantage is bit for bit the
// five-component one.
//
// The pipeline is pinned by docs/method.md and follows §4 of the ReCal paper
// ("Learning Signal Clarity Calibration" and "Distribution-aware
// Optimization"), in this order:
//
//  1. hierarchical gating (Config.Gating): r⁽ᵐ⁾ ← 𝕀(r⁽ᵃⁿˢ⁾ > δ)·r̃⁽ᵐ⁾ for each m in Config.Gated;
//  2. scalar reward r = Σₘ λₘ r⁽ᵐ⁾ (after gating);
//  3. advantage: component-wise (Config.ComponentAdvantages, CAE)
//     A = Σₘ λₘ (r⁽ᵐ⁾ − μᵢ⁽ᵐ⁾)/(σᵢ⁽ᵐ⁾ + ε), else plain GRPO A = (r − μᵢ)/(σᵢ + ε);
//  4. variance-aware reweighting (Config.VarianceReweighting):
//     A ← τᵢ·A with τᵢ = clip(σᵢ/σ̄, τ_min, τ_max), σᵢ the std of the group's scalar rewards;
//  5. per-dataset normalisation (Config.DatasetNormalization):
//     Â = (A − μ⁽ᵈ⁾)/(σ⁽ᵈ⁾ + ε) over the batch's responses from dataset d.
//
// Every standard deviation is the population one (divide by the count), and
// ε is added to σ, never to σ². With every switch off, Calibrate is plain
// GRPO on the scalar reward. The paper's ablations are one call away through
// Ablation.
//
// testdata/reference.py is an independent Python implementation of the same
// pipeline: it produced testdata/golden.json, which the tests compare against,
// and it checks a training run's logged advantages (reference.py check RUN_DIR).
package calibration
