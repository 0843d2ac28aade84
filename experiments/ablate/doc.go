// Package ablate runs `recal ablate`, the ReCal paper's ablation study (its
// Table 3, "Results of Ablation") repeated over several seeds (Run: per
// seed the shared warm-up, then every variant's GRPO and evaluation, then
// the table and the figure; run.go): where each run lives (layout.go), how
// a variant's run starts from its seed's shared supervised warm-up (Seed),
// and the table of exact match per variant as mean ± standard deviation
// over seeds (table.go).
//
// Layout of a study folder:
//
//	seed-<N>/warmup/        the supervised warm-up of seed N (sft only, train.steps = 0)
//	seed-<N>/<variant>/     GRPO of one variant, continuing the warm-up:
//	                        checkpoints/sft links to the warm-up's checkpoint
//	seed-<N>/<variant>/eval-<split>/  its evaluation (eval's results files)
//	ablation.{json,csv,md}  the table
//	ablation_reward.{png,svg} the answer reward over steps per variant
//
// Run trains (trainer) and evaluates (eval), so the package needs cgo;
// its layout and table need neither.
package ablate
