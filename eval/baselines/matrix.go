package baselines

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/recal-project/recal/internal/inputfile"
	"github.com/recal-project/recal/llmpool"
)

// Files of an outcome folder (recal collect --out DIR).
const (
	// PoolFile names the pool the outcomes come from (PoolInfo).
	PoolFile = "pool.json"
	// OutcomesFile holds one Outcome per line, appended as calls finish.
	OutcomesFile = "outcomes.jsonl"
)

// poolVersion is the version of PoolFile's format and of the pool identity.
const poolVersion = 1

// PoolInfo identifies the pool an outcome matrix was collected from.
type PoolInfo struct {
	Version int `json:"version"`
	// ID is "sha256:<hex>" of what decides the replies (see PoolIdentity).
	ID string `json:"id"`
	// Models are the pool's models in config order.
	Models []ModelInfo `json:"models"`
}

// ModelInfo is what the routers know of a pool model.
type ModelInfo struct {
	Name        string  `json:"name"`
	Description string  `json:"description"`
	Provider    string  `json:"provider"`
	PriceIn     float64 `json:"price_in"`  // USD per million input tokens
	PriceOut    float64 `json:"price_out"` // USD per million output tokens
}

// PoolIdentity computes the identity of a pool: its models as configured,
// less the settings that change how calls are made but not what they answer
// (llmpool.ModelConfig.WithoutOperational, as eval's "pool" input), its
// query cap and failure text, and the answer bank simulated models draw
// wrong answers from (digested). Outcomes of pools with another identity
// are never mixed in one folder.
func PoolIdentity(cfg llmpool.Config, bank map[string][]string) (PoolInfo, error) {
	models := make([]llmpool.ModelConfig, len(cfg.Models))
	info := PoolInfo{Version: poolVersion}
	for i, m := range cfg.Models {
		m = m.WithoutOperational()
		models[i] = m
		info.Models = append(info.Models, ModelInfo{Name: m.Name, Description: m.Description, Provider: m.Provider,
			PriceIn: m.PriceIn, PriceOut: m.PriceOut})
	}
	h := sha256.New()
	for _, d := range slices.Sorted(maps.Keys(bank)) {
		fmt.Fprintf(h, "%q:%q\n", d, bank[d])
	}
	b, err := json.Marshal(struct {
		Version       int
		Models        []llmpool.ModelConfig
		MaxQueryChars int
		FailureText   string
		AnswerBank    string
	}{poolVersion, models, cfg.MaxQueryChars, cfg.FailureText, hex.EncodeToString(h.Sum(nil))})
	if err != nil {
		return PoolInfo{}, fmt.Errorf("baselines: pool identity: %w", err)
	}
	sum := sha256.Sum256(b)
	info.ID = "sha256:" + hex.EncodeToString(sum[:])
	return info, nil
}

// Outcome is one line of outcomes.jsonl: a pool model asked a training
// question directly, its reply and how it scored.
type Outcome struct {
	QuestionID string   `json:"question_id"` // data.Example.ID
	Dataset    string   `json:"dataset"`
	Question   string   `json:"question"`
	Golden     []string `json:"golden_answers"`
	Model      string   `json:"model"`
	Reply      string   `json:"reply"`
	// Evidence is what the model wrote when Reply is rendered from a
	// judgment (llmpool.Response.Evidence); the cascade reads agreement on
	// it. Absent otherwise.
	Evidence string `json:"evidence,omitempty"`
	// Answer is the short answer taken out of the reply (eval's extraction);
	// "" when the call failed.
	Answer string `json:"answer"`
	// F1 and EM score Answer against Golden (data.F1, data.ExactMatch).
	F1 float64 `json:"f1"`
	EM float64 `json:"em"`
	// InputTokens and OutputTokens are the call's tokens (estimated when
	// TokensEstimated); Cost is their list price in USD.
	InputTokens     int     `json:"input_tokens"`
	OutputTokens    int     `json:"output_tokens"`
	TokensEstimated bool    `json:"tokens_estimated,omitempty"`
	Cost            float64 `json:"cost"`
	// LatencyMS is the call's wall time in milliseconds (retries included).
	LatencyMS float64 `json:"latency_ms"`
	Cached    bool    `json:"cached,omitempty"`
	// Failed: no reply could be had (after the pool's retries); Error says why.
	Failed bool   `json:"failed,omitempty"`
	Error  string `json:"error,omitempty"`
}

// Question is a training question of the matrix.
type Question struct {
	ID      string `json:"id"`
	Dataset string `json:"dataset"`
	Text    string `json:"text"`
}

// Matrix is the outcome matrix the routers learn from: every question that
// has an outcome for every pool model, sorted by ID, and per question and
// model (in pool order) the scores and costs.
type Matrix struct {
	Pool      PoolInfo
	Models    []string   // pool model names, in pool order
	Questions []Question // sorted by ID
	F1, EM    [][]float64
	Cost      [][]float64 // USD
	Failed    [][]bool
	// Replies are each call's reply as its model wrote it (Outcome.Evidence
	// when set, else Outcome.Reply; the cascade's stopping rule reads them;
	// not in Digest).
	Replies [][]string
	// Incomplete counts the questions left out for lacking some model's
	// outcome (an interrupted collect).
	Incomplete int
	// Digest is "sha256:<hex>" of the pool identity and the rows: the same
	// outcomes give the same digest whatever their order in the file.
	Digest string
}

var (
	// ErrNoOutcomes: the folder holds no outcome matrix.
	ErrNoOutcomes = errors.New("baselines: no outcome matrix")
	// ErrOtherPool: the folder holds outcomes of another pool.
	ErrOtherPool = errors.New("baselines: outcomes of another pool")
)

// readPool reads dir's pool.json (os.ErrNotExist when absent).
func readPool(dir string) (PoolInfo, error) {
	b, err := inputfile.ReadFile(filepath.Join(dir, PoolFile), inputfile.ConfigLimit)
	if err != nil {
		return PoolInfo{}, fmt.Errorf("baselines: %w", err)
	}
	var p PoolInfo
	if err := json.Unmarshal(b, &p); err != nil || p.ID == "" || len(p.Models) == 0 {
		return PoolInfo{}, fmt.Errorf("baselines: %s: not a pool identity (%v)", filepath.Join(dir, PoolFile), err)
	}
	if p.Version != poolVersion {
		return PoolInfo{}, fmt.Errorf("baselines: %s: version %d, this build reads %d; collect again into another folder", filepath.Join(dir, PoolFile), p.Version, poolVersion)
	}
	return p, nil
}

// readOutcomes reads outcomes.jsonl: the latest line of each (question,
// model) pair wins; a line that does not parse (a torn last line after a
// kill) is skipped.
func readOutcomes(dir string) (map[[2]string]Outcome, error) {
	f, err := inputfile.Open(filepath.Join(dir, OutcomesFile))
	if err != nil {
		return nil, fmt.Errorf("baselines: %w", err)
	}
	defer f.Close()
	out := map[[2]string]Outcome{}
	r := bufio.NewReaderSize(f, 1<<20)
	for {
		line, err := r.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			var o Outcome
			if json.Unmarshal(line, &o) == nil && o.QuestionID != "" && o.Model != "" {
				out[[2]string{o.QuestionID, o.Model}] = o
			}
		}
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("baselines: %s: %w", f.Name(), err)
		}
	}
}

// LoadMatrix reads the outcome matrix of a collect folder. A folder without
// outcomes is an error wrapping ErrNoOutcomes that names the command making
// them.
func LoadMatrix(dir string) (*Matrix, error) {
	pool, err := readPool(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w in %s: make one with `recal collect --config recal.toml --out %s`", ErrNoOutcomes, dir, dir)
	}
	if err != nil {
		return nil, err
	}
	outs, err := readOutcomes(dir)
	if errors.Is(err, os.ErrNotExist) {
		outs = nil
	} else if err != nil {
		return nil, err
	}
	m := &Matrix{Pool: pool}
	col := map[string]int{}
	for j, mi := range pool.Models {
		m.Models = append(m.Models, mi.Name)
		col[mi.Name] = j
	}
	byQ := map[string][]Outcome{}
	for k, o := range outs {
		if _, ok := col[k[1]]; ok {
			byQ[k[0]] = append(byQ[k[0]], o)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(byQ)) {
		row := byQ[id]
		if len(row) != len(m.Models) {
			m.Incomplete++
			continue
		}
		f1, em, cost := make([]float64, len(m.Models)), make([]float64, len(m.Models)), make([]float64, len(m.Models))
		failed := make([]bool, len(m.Models))
		replies := make([]string, len(m.Models))
		for _, o := range row {
			j := col[o.Model]
			f1[j], em[j], cost[j], failed[j] = o.F1, o.EM, o.Cost, o.Failed
			replies[j] = o.Reply
			if o.Evidence != "" {
				replies[j] = o.Evidence
			}
		}
		m.Replies = append(m.Replies, replies)
		m.Questions = append(m.Questions, Question{ID: id, Dataset: row[0].Dataset, Text: row[0].Question})
		m.F1, m.EM, m.Cost, m.Failed = append(m.F1, f1), append(m.EM, em), append(m.Cost, cost), append(m.Failed, failed)
	}
	if len(m.Questions) == 0 {
		return nil, fmt.Errorf("%w in %s: no question has an outcome for every model (%d incomplete); run `recal collect --out %s` again to finish it",
			ErrNoOutcomes, dir, m.Incomplete, dir)
	}
	m.seal()
	return m, nil
}

// seal computes Digest.
func (m *Matrix) seal() {
	b, _ := json.Marshal(struct { // strings, floats and bools always encode
		Pool      string
		Models    []string
		Questions []Question
		F1, EM    [][]float64
		Cost      [][]float64
		Failed    [][]bool
	}{m.Pool.ID, m.Models, m.Questions, m.F1, m.EM, m.Cost, m.Failed})
	sum := sha256.Sum256(b)
	m.Digest = "sha256:" + hex.EncodeToString(sum[:])
}

// Datasets lists the matrix's datasets, sorted.
func (m *Matrix) Datasets() []string {
	seen := map[string]bool{}
	for _, q := range m.Questions {
		seen[q.Dataset] = true
	}
	return slices.Sorted(maps.Keys(seen))
}

// Summary is a table of mean F1 and mean cost per dataset and model, for
// people reading collect's output.
func (m *Matrix) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-12s %6s", "dataset", "n")
	for _, name := range m.Models {
		fmt.Fprintf(&b, " %18s", name)
	}
	b.WriteString("   (mean F1 / mean cost in micro-USD)\n")
	for _, d := range m.Datasets() {
		n := 0
		f1, cost := make([]float64, len(m.Models)), make([]float64, len(m.Models))
		for i, q := range m.Questions {
			if q.Dataset != d {
				continue
			}
			n++
			for j := range m.Models {
				f1[j] += m.F1[i][j]
				cost[j] += m.Cost[i][j]
			}
		}
		fmt.Fprintf(&b, "%-12s %6d", d, n)
		for j := range m.Models {
			fmt.Fprintf(&b, " %9.3f / %6.2f", f1[j]/float64(n), 1e6*cost[j]/float64(n))
		}
		b.WriteByte('\n')
	}
	return b.String()
}
