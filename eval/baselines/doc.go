// Package baselines holds the discriminative baseline routers of the ReCal
// paper's Table 1 that learn from outcomes: the outcome matrix (Collect:
// every pool model asked every training question directly, through the
// pool; LoadMatrix reads it back) and four trainable routers registered in
// one place (registry, registry.go) with one signature, each documented at its model
// type with the paper it follows and where it departs:
//
//   - "mlp": RouterBench's MLP router (mlpModel);
//   - "routellm-mf": RouteLLM's matrix factorisation, generalised from two
//     models to the pool (mfModel);
//   - "routerdc": RouterDC's dual contrastive router (dcModel);
//   - "graphrouter": GraphRouter's heterogeneous graph with edge prediction
//     (graphModel).
//
// Fit trains one on a Matrix with question embeddings from package embed,
// deterministically for a seed, keeping the weights that route held-out
// questions best (fit.go, select.go); Router.Save writes a folder (manifest.json,
// weights.safetensors, the embedder's fitted state) and Load reads it back,
// refusing a folder that does not match its manifest (ErrCorrupt) or other
// embeddings (ErrEmbedding) (folder.go). The networks are small and pure Go: a tape of
// float64 matrices with hand-written backward passes and AdamW (nn.go).
// `recal collect`, `recal fit` and eval's routers of the same names wire
// them to the command line.
package baselines
