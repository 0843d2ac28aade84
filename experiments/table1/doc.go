// Package table1 makes the ReCal paper's Table 1 in one call (Run; the
// command is recal table1): it makes what the rows need and is missing
// from its work folder, then evaluates every row into it. The work folder
// holds
//
//	outcomes/                 the outcome matrix (recal collect --out)
//	routers/<name>/           the fitted baseline routers (recal fit --router-dir)
//	routers/<name>.fit.json   what each was fitted from (matrix, tables, seed)
//	sft-direct/               the SFT row's checkpoint (recal train-sft-direct --out)
//	router-r1/                the Router-R1 row's run (train.algorithm = "ppo")
//	eval-<split>/<row>/       each row's results-<router>.jsonl (recal eval's files)
//	eval-<split>/table.*      the table: JSON, CSV and Markdown
//
// Each part is reused when it was made from the same inputs, so a rerun
// trains nothing and calls no pool for what it has: collect asks only the
// missing (question, model) pairs, routers are refitted only when their
// matrix, [baselines] or [embedding] tables or seed change, the SFT-direct
// and Router-R1 checkpoints are reused under their configuration (a
// changed one is an error naming the differing keys), and each row's
// results are resumed by eval's identity rules.
//
// Why a package of its own, not eval: making the table trains (the
// SFT-direct baseline, Router-R1's PPO through trainer) and fits
// (baselines), while eval only evaluates a policy it is given and so
// imports neither the training loop nor what trains. eval keeps what
// defines and renders the table (eval.Table1Rows, eval.PaperTable); this
// package orchestrates: collect → fit → SFT-direct → PPO → every row.
// Like package ablate, it is an experiment of the paper, testable without
// the CLI.
package table1
