// Package data provides the QA datasets of recal: loading them from JSON
// Lines and Parquet files, the registry of the seven datasets and their
// splits, deterministic test, validation and training samples, and the
// answer metrics (exact match and token F1).
//
// # Datasets
//
// The registry holds nq, triviaqa, popqa, hotpotqa, 2wiki, musique and
// bamboogle (see Known). Split "id" (in domain, trained on) is nq and
// hotpotqa; "ood" is the other five; "all" is every one. nq, triviaqa and
// popqa are single-hop, the others multi-hop (IsMultiHop).
//
// Small copies of all seven live in data/qa/<dataset>/{train,test}.jsonl
// (see data/qa/SOURCES.md and data/qa/README.md); Config points at them by
// default.
//
// # File formats
//
// LoadFile reads rows as FlashRAG, Search-R1 and Router-R1 publish them:
// question, golden_answers (a list of strings, or Search-R1's
// reward_model.ground_truth.target), id (string or integer; the row index
// when absent) and the dataset name in data_source or dataset. Parquet
// lists must use the standard 3-level LIST layout with the element named
// "element" or "item"; any other layout is an error naming the file and
// column.
//
// Every example gets a globally unique ID "<dataset>/<source id>", so that
// an NQ and a HotpotQA question with the same source id never share a GRPO
// group.
//
// # Sampling
//
// Samples and shuffles use a generator written out in this package, so they
// do not change with the Go release. Test sets keep up to
// Config.TestPerDataset questions per dataset (docs/method.md: 500, all 125 of
// Bamboogle) in file order. Validation questions are held out of the
// training files. Sampler shuffles the mixed training set per epoch and its
// SamplerState restores a run exactly.
package data
