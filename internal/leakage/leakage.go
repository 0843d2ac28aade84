// Package leakage measures how much the form of a replayed reply tells
// about its judgment. A replayed world (llmpool provider "replay") is
// evidence about routing only when a policy learns no more from a reply
// than it would from the real one: a renderer that writes right replies in
// one template and wrong ones in another hands the policy the answer key.
//
// Check trains a simple classifier, logistic regression on hashed character
// n-grams of the reply alone (never the question or the model), on the
// judged rows of some questions and reports its AUC at predicting the
// judgment on the rows of the other questions: once for the rendered
// replies, once for the logged reply text on the rows that have it. 0.5 is
// chance. A renderer leaks when its AUC is clearly above the logged text's
// (the real replies' own tell: a refusal, a hedge, a model's style).
package leakage

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"

	"github.com/recal-project/recal/internal/outcomes"
)

// Options of Check. The zero value is the defaults.
type Options struct {
	// TestShare is the share of questions held out for the AUC, drawn by
	// SHA-256 of the question id (rows of one question are never split).
	// Default 0.3.
	TestShare float64
	// MinN and MaxN are the character n-gram lengths. Default 1 and 4.
	MinN, MaxN int
	// Bits: the n-grams are hashed into 2^Bits features. Default 18.
	Bits int
	// Epochs of the classifier's training. Default 10.
	Epochs int
}

// Defaults of Options.
const (
	DefaultTestShare = 0.3
	DefaultMinN      = 1
	DefaultMaxN      = 4
	DefaultBits      = 18
	DefaultEpochs    = 10
)

func (o *Options) setDefaults() {
	if o.TestShare == 0 {
		o.TestShare = DefaultTestShare
	}
	if o.MinN == 0 {
		o.MinN = DefaultMinN
	}
	if o.MaxN == 0 {
		o.MaxN = DefaultMaxN
	}
	if o.Bits == 0 {
		o.Bits = DefaultBits
	}
	if o.Epochs == 0 {
		o.Epochs = DefaultEpochs
	}
}

func (o Options) validate() error {
	switch {
	case !(o.TestShare > 0 && o.TestShare < 1):
		return fmt.Errorf("leakage: test share %v, want 0 < share < 1", o.TestShare)
	case o.MinN < 1 || o.MaxN < o.MinN || o.MaxN > 16:
		return fmt.Errorf("leakage: n-gram lengths %d..%d, want 1 <= min <= max <= 16", o.MinN, o.MaxN)
	case o.Bits < 8 || o.Bits > 24:
		return fmt.Errorf("leakage: feature bits %d, want 8..24", o.Bits)
	case o.Epochs < 1 || o.Epochs > 1000:
		return fmt.Errorf("leakage: epochs %d, want 1..1000", o.Epochs)
	}
	return nil
}

// Sentinels.
var (
	// ErrTooFew: the log has too few judged rows on one side of the split,
	// or only one judgment there, to measure an AUC.
	ErrTooFew = errors.New("leakage: too few judged rows")
)

// Report is what Check measured.
type Report struct {
	Log string `json:"log"`
	// Render is the render mode checked (CheckFile); "" for a renderer
	// given to Check.
	Render string `json:"render,omitempty"`
	// Rows are the judged rows (with Correct set); Train and Test those of
	// the training and the held-out questions.
	Rows  int `json:"rows"`
	Train int `json:"train_rows"`
	Test  int `json:"test_rows"`
	// RightShare is the share of judged rows judged right.
	RightShare float64 `json:"right_share"`
	// Rendered is the classifier's AUC on the held-out rendered replies.
	Rendered float64 `json:"rendered_auc"`
	// LoggedRows are the held-out judged rows with reply text; Logged is the
	// AUC of the classifier trained on the logged text (of the training
	// rows with text) on them, and RenderedOnLogged the rendered replies'
	// AUC on those same rows. Both are null when no row has text.
	LoggedRows       int      `json:"logged_rows"`
	Logged           *float64 `json:"logged_auc"`
	RenderedOnLogged *float64 `json:"rendered_auc_on_logged_rows"`
	// Models are the same AUCs on each model's held-out rows (the
	// classifiers trained on every model's rows), by model name.
	Models []ModelReport `json:"models"`
	// Agreement is, for each pair of models asked for (CheckFile), how
	// often the first's answer occurs in the second's reply.
	Agreement []Agreement `json:"agreement,omitempty"`
	// Options are the settings used.
	Options Options `json:"options"`
}

// ModelReport is Report's AUCs on one model's held-out rows.
type ModelReport struct {
	Model      string   `json:"model"`
	Test       int      `json:"test_rows"`
	RightShare float64  `json:"right_share"`
	Rendered   *float64 `json:"rendered_auc"`
	Logged     *float64 `json:"logged_auc"`
}

// Check measures the leakage of render over log l (see the package doc).
// render gives a row's reply as a replayed model would (for a pool,
// llmpool.NewReplayRenderer(l).Text with its render mode). Rows without a
// judgment are left out. The split, the features and the classifier are
// deterministic: the same log and renderer give the same report.
func Check(l *outcomes.Log, render func(outcomes.Row) string, opt Options) (Report, error) {
	opt.setDefaults()
	if err := opt.validate(); err != nil {
		return Report{}, err
	}
	rep := Report{Log: l.Name, Options: opt}
	var train, test []int
	right := 0
	for i, row := range l.Rows {
		if row.Correct == nil {
			continue
		}
		rep.Rows++
		if *row.Correct {
			right++
		}
		if heldOut(row.QuestionID, opt.TestShare) {
			test = append(test, i)
		} else {
			train = append(train, i)
		}
	}
	rep.Train, rep.Test = len(train), len(test)
	if rep.Rows > 0 {
		rep.RightShare = float64(right) / float64(rep.Rows)
	}
	label := func(i int) bool { return *l.Rows[i].Correct }
	if err := enough(l.Name, train, test, label); err != nil {
		return rep, err
	}
	rendered := func(i int) string { return render(l.Rows[i]) }
	renderedScores := fitScore(train, test, rendered, label, opt)
	rep.Rendered = AUC(subset(renderedScores, test), labelsOf(test, label))

	hasText := func(i int) bool { return l.Rows[i].Reply != nil }
	trainText, testText := filter(train, hasText), filter(test, hasText)
	rep.LoggedRows = len(testText)
	var loggedScores map[int]float64
	if enough(l.Name, trainText, testText, label) == nil {
		logged := func(i int) string { return *l.Rows[i].Reply }
		loggedScores = fitScore(trainText, testText, logged, label, opt)
		a := AUC(subset(loggedScores, testText), labelsOf(testText, label))
		b := AUC(subset(renderedScores, testText), labelsOf(testText, label))
		rep.Logged, rep.RenderedOnLogged = &a, &b
	}

	byModel := map[string][]int{}
	for _, i := range test {
		byModel[l.Rows[i].Model] = append(byModel[l.Rows[i].Model], i)
	}
	for _, m := range slices.Sorted(maps.Keys(byModel)) {
		rows := byModel[m]
		mr := ModelReport{Model: m, Test: len(rows)}
		pos := 0
		for _, i := range rows {
			if label(i) {
				pos++
			}
		}
		mr.RightShare = float64(pos) / float64(len(rows))
		if pos > 0 && pos < len(rows) {
			a := AUC(subset(renderedScores, rows), labelsOf(rows, label))
			mr.Rendered = &a
			if loggedScores != nil {
				withText := filter(rows, hasText)
				if p := countTrue(withText, label); p > 0 && p < len(withText) {
					b := AUC(subset(loggedScores, withText), labelsOf(withText, label))
					mr.Logged = &b
				}
			}
		}
		rep.Models = append(rep.Models, mr)
	}
	return rep, nil
}

// enough reports ErrTooFew unless both sides of the split hold rows of both
// judgments.
func enough(name string, train, test []int, label func(int) bool) error {
	pt, pe := countTrue(train, label), countTrue(test, label)
	if pt == 0 || pt == len(train) || pe == 0 || pe == len(test) {
		return fmt.Errorf("%w in %s: training questions: %d rows, %d judged right; held-out questions: %d rows, %d judged right (each side needs rows judged right and rows judged wrong)",
			ErrTooFew, name, len(train), pt, len(test), pe)
	}
	return nil
}

// heldOut reports whether question id is held out: the first 8 bytes of
// SHA-256("leakage/" + id), as a fraction of 2^64, below share.
func heldOut(id string, share float64) bool {
	sum := sha256.Sum256([]byte("leakage/" + id))
	return float64(binary.BigEndian.Uint64(sum[:8]))/math.Exp2(64) < share
}

// fitScore trains the classifier on the train rows' texts and returns its
// scores of the test rows, by row index.
func fitScore(train, test []int, text func(int) string, label func(int) bool, opt Options) map[int]float64 {
	c := newClassifier(opt)
	xs := make([]sparse, len(train))
	ys := make([]bool, len(train))
	for k, i := range train {
		xs[k], ys[k] = c.features(text(i)), label(i)
	}
	c.fit(xs, ys)
	out := make(map[int]float64, len(test))
	for _, i := range test {
		out[i] = c.score(c.features(text(i)))
	}
	return out
}

// sparse is a feature vector: sorted indices and their values.
type sparse struct {
	idx []uint32
	val []float64
}

// classifier is L2-regularised logistic regression on hashed character
// n-grams (sublinear counts, unit length), trained by AdaGrad over shuffled
// rows (a fixed seed).
type classifier struct {
	opt  Options
	w    []float64
	g2   []float64
	bias float64
	bg2  float64
}

const (
	learningRate = 0.5
	l2           = 1e-6
)

func newClassifier(opt Options) *classifier {
	n := 1 << opt.Bits
	return &classifier{opt: opt, w: make([]float64, n), g2: make([]float64, n)}
}

// features hashes the character n-grams of "\x02" + text + "\x03" (the
// ends marked, so the first and last characters are features of their
// own); counts become 1 + ln(count), and the vector has unit length.
func (c *classifier) features(text string) sparse {
	rs := []rune("\x02" + text + "\x03")
	counts := map[uint32]float64{}
	mask := uint32(1)<<c.opt.Bits - 1
	var buf strings.Builder
	for n := c.opt.MinN; n <= c.opt.MaxN; n++ {
		for i := 0; i+n <= len(rs); i++ {
			buf.Reset()
			buf.WriteByte(byte(n))
			buf.WriteString(string(rs[i : i+n]))
			h := fnv.New32a()
			h.Write([]byte(buf.String()))
			counts[h.Sum32()&mask]++
		}
	}
	var x sparse
	for k := range counts {
		x.idx = append(x.idx, k)
	}
	slices.Sort(x.idx)
	norm := 0.0
	for _, k := range x.idx {
		v := 1 + math.Log(counts[k])
		x.val = append(x.val, v)
		norm += v * v
	}
	norm = math.Sqrt(norm)
	for j := range x.val {
		x.val[j] /= norm
	}
	return x
}

func (c *classifier) score(x sparse) float64 {
	z := c.bias
	for j, k := range x.idx {
		z += c.w[k] * x.val[j]
	}
	return z
}

func (c *classifier) fit(xs []sparse, ys []bool) {
	order := make([]int, len(xs))
	for i := range order {
		order[i] = i
	}
	rng := rand.New(rand.NewPCG(0, 38))
	for range c.opt.Epochs {
		rng.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
		for _, i := range order {
			x := xs[i]
			y := 0.0
			if ys[i] {
				y = 1
			}
			g := sigmoid(c.score(x)) - y
			for j, k := range x.idx {
				gk := g*x.val[j] + l2*c.w[k]
				c.g2[k] += gk * gk
				c.w[k] -= learningRate * gk / (math.Sqrt(c.g2[k]) + 1e-8)
			}
			c.bg2 += g * g
			c.bias -= learningRate * g / (math.Sqrt(c.bg2) + 1e-8)
		}
	}
}

func sigmoid(z float64) float64 {
	if z >= 0 {
		return 1 / (1 + math.Exp(-z))
	}
	e := math.Exp(z)
	return e / (1 + e)
}

// AUC is the area under the ROC curve of scores against labels (parallel
// by position): the chance that a random positive outscores a random
// negative, ties counting one half (Mann–Whitney). NaN when either class is
// empty.
func AUC(scores []float64, labels []bool) float64 {
	type pair struct {
		s float64
		y bool
	}
	ps := make([]pair, len(scores))
	pos, neg := 0, 0
	for i := range scores {
		ps[i] = pair{scores[i], labels[i]}
		if labels[i] {
			pos++
		} else {
			neg++
		}
	}
	if pos == 0 || neg == 0 {
		return math.NaN()
	}
	sort.SliceStable(ps, func(a, b int) bool { return ps[a].s < ps[b].s })
	rankSum := 0.0
	for i := 0; i < len(ps); {
		j := i
		for j < len(ps) && ps[j].s == ps[i].s {
			j++
		}
		mid := float64(i+j+1) / 2 // mean 1-based rank of the tie group
		for k := i; k < j; k++ {
			if ps[k].y {
				rankSum += mid
			}
		}
		i = j
	}
	return (rankSum - float64(pos)*float64(pos+1)/2) / (float64(pos) * float64(neg))
}

func labelsOf(rows []int, label func(int) bool) []bool {
	out := make([]bool, len(rows))
	for k, i := range rows {
		out[k] = label(i)
	}
	return out
}

// subset returns the scores of rows, in rows' order. Call it with labelsOf
// the same rows.
func subset(scores map[int]float64, rows []int) []float64 {
	out := make([]float64, len(rows))
	for k, i := range rows {
		out[k] = scores[i]
	}
	return out
}

func filter(rows []int, keep func(int) bool) []int {
	var out []int
	for _, i := range rows {
		if keep(i) {
			out = append(out, i)
		}
	}
	return out
}

func countTrue(rows []int, label func(int) bool) int {
	n := 0
	for _, i := range rows {
		if label(i) {
			n++
		}
	}
	return n
}
