// Package trainer trains the policy: GRPO with ReCal's calibrated
// advantages, Router-R1's PPO, the supervised format warm-up, validation,
// checkpoints and resumption. Rollouts, scoring and the policy engine are
// package rollout's; trainer wires them to calibration and the optimizer
// in torchbridge.
package trainer
