package embed

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"slices"
	"strings"
	"unicode"
)

// localModel names the local feature set; bump its version when the
// features change, so that routers fitted on the old ones are refused.
const localModel = "hashed-ngrams-v2"

// local is the offline provider ("local"): a bag of hashed n-gram features,
// the feature-hashing trick of Weinberger et al. (2009) over the word and
// character n-grams of fastText-style text classifiers. For a text:
//
//   - it is split into words (maximal runs of letters and digits); the
//     features are the lowercased word unigrams and bigrams and the
//     character 3-, 4- and 5-grams of the words as written (case kept, as
//     fastText's are: capitals mark names and titles) joined by single
//     spaces with a space at each end (so n-grams see word boundaries);
//   - each distinct feature f with count c gets weight 1 + ln c (sublinear
//     tf), times idf[j], and is added with a sign to bucket j, where j and
//     the sign come from a 64-bit FNV-1a hash of the feature (mixed by
//     SplitMix64's finaliser; the sign is its top bit, which keeps collisions
//     from biasing the vector);
//   - the vector is scaled to unit length (a text without letters or digits
//     gives the zero vector).
//
// idf[j] = ln((1 + N) / (1 + df_j)) + 1 (scikit-learn's smoothed IDF), where
// N is the number of texts Fit saw and df_j how many of them have a feature
// in bucket j. Unfitted, idf is 1 everywhere: plain l2-normalised hashed tf.
// The baseline routers fit it on their training questions and save it
// (State) with the router, so a router embeds new questions exactly as it
// embedded its training ones. Features are summed in a fixed order, so the
// vectors are bit-for-bit deterministic.
type local struct {
	dim   int
	docs  int       // texts the IDF was fitted on (0: unfitted)
	idf   []float32 // nil when unfitted
	state string    // digest of State(), "" when unfitted
	memo  *memo
}

func newLocal(cfg Config, _ Env) (Embedder, error) {
	return &local{dim: cfg.Dim, memo: &memo{}}, nil
}

func (l *local) Info() Info {
	return Info{Provider: "local", Model: localModel, Dim: l.dim, State: l.state}
}

func (l *local) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	out := make([][]float32, len(texts))
	info := l.Info()
	for i, t := range texts {
		if i%256 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		k := memoKey(info, t)
		if v, ok := l.memo.get(k); ok {
			out[i] = clone(v)
			continue
		}
		v := l.vector(t)
		l.memo.put(k, clone(v))
		out[i] = v
	}
	return out, nil
}

// vector computes the embedding of one text.
func (l *local) vector(text string) []float32 {
	counts := features(text)
	acc := make([]float64, l.dim)
	mask := uint64(l.dim - 1)
	for _, h := range slices.Sorted(maps.Keys(counts)) {
		j := h & mask
		w := 1 + math.Log(float64(counts[h]))
		if l.idf != nil {
			w *= float64(l.idf[j])
		}
		if h>>63 == 1 {
			w = -w
		}
		acc[j] += w
	}
	v := make([]float32, l.dim)
	var s float64
	for _, x := range acc {
		s += x * x
	}
	if s == 0 {
		return v
	}
	n := 1 / math.Sqrt(s)
	for j, x := range acc {
		v[j] = float32(x * n)
	}
	return v
}

// features counts the hashed features of a text, by their 64-bit hash.
func features(text string) map[uint64]int {
	words := strings.FieldsFunc(text, func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r)
	})
	counts := map[uint64]int{}
	add := func(kind byte, s string) { counts[hashFeature(kind, s)]++ }
	for i, w := range words {
		add('w', strings.ToLower(w))
		if i > 0 {
			add('b', strings.ToLower(words[i-1]+" "+w))
		}
	}
	if len(words) > 0 {
		r := []rune(" " + strings.Join(words, " ") + " ")
		for n := 3; n <= 5; n++ {
			for i := 0; i+n <= len(r); i++ {
				add('c', string(r[i:i+n]))
			}
		}
	}
	return counts
}

// hashFeature is FNV-1a 64 of kind and s, mixed by SplitMix64's finaliser so
// that every bit depends on every input bit.
func hashFeature(kind byte, s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte{kind, ':'})
	h.Write([]byte(s))
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Fit returns a copy with the IDF of texts. Fitting on no text is an error.
func (l *local) Fit(texts []string) (Embedder, error) {
	if len(texts) == 0 {
		return nil, fmt.Errorf("embed: local: fit on no text")
	}
	mask := uint64(l.dim - 1)
	df := make([]int, l.dim)
	seen := make([]bool, l.dim)
	for _, t := range texts {
		var touched []uint64
		for h := range features(t) {
			j := h & mask
			if !seen[j] {
				seen[j] = true
				touched = append(touched, j)
			}
		}
		for _, j := range touched {
			df[j]++
			seen[j] = false
		}
	}
	idf := make([]float32, l.dim)
	n := float64(len(texts))
	for j := range idf {
		idf[j] = float32(math.Log((1+n)/(1+float64(df[j]))) + 1)
	}
	return l.withIDF(len(texts), idf), nil
}

func (l *local) withIDF(docs int, idf []float32) *local {
	c := &local{dim: l.dim, docs: docs, idf: idf, memo: &memo{}}
	sum := sha256.Sum256(c.State())
	c.state = "sha256:" + hex.EncodeToString(sum[:8])
	return c
}

// localState is the encoding of the fitted IDF.
type localState struct {
	Model string    `json:"model"`
	Dim   int       `json:"dim"`
	Docs  int       `json:"docs"`
	IDF   []float32 `json:"idf"`
}

// State is the IDF as JSON (encoding/json writes float32 values in their
// shortest exact form, so the same IDF gives the same bytes), nil unfitted.
func (l *local) State() []byte {
	if l.idf == nil {
		return nil
	}
	b, _ := json.Marshal(localState{Model: localModel, Dim: l.dim, Docs: l.docs, IDF: l.idf}) // always encodes
	return b
}

// WithState returns a copy with the IDF read from State's bytes.
func (l *local) WithState(b []byte) (Embedder, error) {
	var s localState
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("%w: local: %v", ErrState, err)
	}
	switch {
	case s.Model != localModel:
		return nil, fmt.Errorf("%w: local: features %q, this build computes %q", ErrState, s.Model, localModel)
	case s.Dim != l.dim || len(s.IDF) != l.dim:
		return nil, fmt.Errorf("%w: local: IDF of %d features (dim %d), embedding.dim is %d", ErrState, len(s.IDF), s.Dim, l.dim)
	case s.Docs < 1:
		return nil, fmt.Errorf("%w: local: IDF fitted on %d texts", ErrState, s.Docs)
	}
	for j, x := range s.IDF {
		if !(x >= 1) || math.IsInf(float64(x), 0) {
			return nil, fmt.Errorf("%w: local: idf[%d] = %v, want a finite value ≥ 1", ErrState, j, x)
		}
	}
	return l.withIDF(s.Docs, s.IDF), nil
}
