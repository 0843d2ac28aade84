package baselines

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/recal-project/recal/data"
)

// The cascade (FrugalGPT, Chen et al. 2023, arXiv:2305.05176: "LLM
// cascade") asks the pool's models one after another, cheapest first, and
// stops as soon as a stopping rule trusts the latest answer; the last model
// of the chain always answers. Every call it made counts in its cost.
//
// The chain: the pool's models by mean cost on the outcome matrix, cheapest
// first (ties in pool order), keeping a model only when its mean EM on the
// matrix is above that of every cheaper model kept (a dearer model that
// answers worse is never worth asking after a cheaper one).
//
// The stopping rule (replies agreeing, FrugalGPT's scorer reduced to one
// feature): after asking the k-th model of the chain (k = 0, 1, ...), its
// reply is supported by each earlier reply that agrees with it (data.Agree,
// router.agreement's rule: one's short answer occurs in the other's
// normalised text as whole words, either way round), both read on what the
// models wrote (a replayed reply's evidence, not its rendering: Support).
// A failed call supports nothing and is supported by nothing. The score of
// stopping is the rate, on the matrix, at which the
// k-th model's answer scored an exact match when the same number of earlier
// replies supported it, add-one smoothed ((right + 1) / (n + 2)). The
// cascade stops at the first k whose score is at least the threshold. A
// threshold of 0 asks the cheapest model alone; one above every score asks
// the whole chain.

// CascadeRule is a fitted cascade.
type CascadeRule struct {
	// Chain are the pool models asked, in order.
	Chain []string `json:"chain"`
	// Score[k][s] is the score of stopping after the k-th model when s
	// earlier replies support its answer (s <= k); N[k][s] the matrix's
	// questions it was estimated from.
	Score [][]float64 `json:"score"`
	N     [][]int     `json:"n"`
	// Matrix is the digest of the outcome matrix fitted on.
	Matrix string `json:"matrix"`
	// Agreement is the version of the support rule (CascadeAgreement).
	Agreement int `json:"agreement"`
}

// CascadeAgreement is the support rule's version, in a fitted rule's
// digest so that results of an earlier rule are not resumed. 2: data.Agree
// on what the models wrote (before: the reply's extracted answer in the
// earlier rendered replies, one way).
const CascadeAgreement = 2

// ErrThreshold: a cascade threshold outside [0, 1].
var ErrThreshold = errors.New("baselines: cascade threshold out of range")

// FitCascade fits the cascade's chain and stopping rule on m (see the
// comment above CascadeRule). Failed calls count as wrong answers.
func FitCascade(m *Matrix) (*CascadeRule, error) {
	if m == nil || len(m.Questions) == 0 || len(m.Models) == 0 {
		return nil, fmt.Errorf("%w: the cascade needs questions and models", ErrNoOutcomes)
	}
	if len(m.Replies) != len(m.Questions) {
		return nil, fmt.Errorf("baselines: cascade: the outcome matrix holds no replies (load it with LoadMatrix)")
	}
	n := len(m.Questions)
	meanCost, meanEM := make([]float64, len(m.Models)), make([]float64, len(m.Models))
	for i := range n {
		for j := range m.Models {
			meanCost[j] += m.Cost[i][j] / float64(n)
			meanEM[j] += m.EM[i][j] / float64(n)
		}
	}
	order := make([]int, len(m.Models))
	for j := range order {
		order[j] = j
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch {
		case meanCost[a] < meanCost[b]:
			return -1
		case meanCost[a] > meanCost[b]:
			return 1
		}
		return 0
	})
	var chain []int
	best := math.Inf(-1)
	for _, j := range order {
		if meanEM[j] > best {
			chain = append(chain, j)
			best = meanEM[j]
		}
	}
	r := &CascadeRule{Matrix: m.Digest, Agreement: CascadeAgreement}
	right := make([][]int, len(chain))
	r.N = make([][]int, len(chain))
	for k, j := range chain {
		r.Chain = append(r.Chain, m.Models[j])
		right[k], r.N[k] = make([]int, k+1), make([]int, k+1)
	}
	for i := range n {
		var replies []string // the earlier replies that did not fail
		for k, j := range chain {
			s := 0
			if !m.Failed[i][j] {
				s = Support(m.Replies[i][j], replies)
				replies = append(replies, m.Replies[i][j])
			}
			r.N[k][s]++
			if m.EM[i][j] == 1 && !m.Failed[i][j] {
				right[k][s]++
			}
		}
	}
	r.Score = make([][]float64, len(chain))
	for k := range chain {
		r.Score[k] = make([]float64, k+1)
		for s := range r.Score[k] {
			r.Score[k][s] = (float64(right[k][s]) + 1) / (float64(r.N[k][s]) + 2)
		}
	}
	return r, nil
}

// Support counts the earlier replies that agree with reply (data.Agree).
// Give each as its model wrote it (llmpool.Response.Evidence when set,
// Outcome.Evidence), and leave failed calls out.
func Support(reply string, earlier []string) int {
	n := 0
	for _, e := range earlier {
		if data.Agree(reply, e) {
			n++
		}
	}
	return n
}

// Stop reports whether the cascade stops after the k-th model of the chain
// when support earlier replies state its answer, at threshold t. The last
// model always stops.
func (r *CascadeRule) Stop(k, support int, t float64) bool {
	if k >= len(r.Chain)-1 {
		return true
	}
	return r.Score[k][min(support, k)] >= t
}

// CheckThreshold returns an error wrapping ErrThreshold naming key unless t
// is in [0, 1].
func CheckThreshold(key string, t float64) error {
	if !(t >= 0 && t <= 1) {
		return fmt.Errorf("%w: %s = %v, want 0 <= threshold <= 1", ErrThreshold, key, t)
	}
	return nil
}

// Digest is "sha256:<hex>" of the rule's JSON: it keys the cascade's
// results.
func (r *CascadeRule) Digest() string {
	b, _ := json.Marshal(r) // strings, ints and finite floats always encode
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Thresholds are the distinct scores of r, ascending, with 0 first and a
// value above every score last: the operating points a threshold sweep can
// reach (each threshold between two of them routes as the higher one).
func (r *CascadeRule) Thresholds() []float64 {
	out := []float64{0}
	for k := 0; k < len(r.Score)-1; k++ {
		out = append(out, r.Score[k]...)
	}
	slices.Sort(out)
	out = slices.Compact(out)
	return append(out, 1)
}
