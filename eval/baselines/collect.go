package baselines

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/recal-project/recal/data"
	"github.com/recal-project/recal/internal/atomicfile"
	"github.com/recal-project/recal/llmpool"
)

// CollectOptions says what Collect asks and where it writes.
type CollectOptions struct {
	// Pool answers; its cache, limits and retries apply to every call.
	Pool *llmpool.Pool
	// Info is the pool's identity (PoolIdentity); the folder keeps the
	// outcomes of one identity only.
	Info PoolInfo
	// Questions are the training questions to ask every model.
	Questions []data.Example
	// Extract takes the short answer out of a reply (eval.ExtractAnswer, so
	// outcomes score replies as eval's direct routers do).
	Extract func(reply string) string
	// Chunk is the calls made together and appended in one write (the pool
	// bounds the requests on the wire). Default 256.
	Chunk int
	// Log receives progress and warnings (default: discard).
	Log *slog.Logger
	// Progress, if set, is called after each chunk with the pairs done
	// (skipped ones included) and the total.
	Progress func(done, total int)
}

// CollectStats counts what Collect did.
type CollectStats struct {
	Pairs   int // (question, model) pairs asked for
	Skipped int // already in the folder
	Asked   int // asked now
	Failed  int // of those asked, calls that got no reply (asked again on the next run)
}

// Collect asks every pool model every question directly (the question is
// the only user message, as eval's direct routers send it) and appends one
// Outcome per (question, model) to dir/outcomes.jsonl, scored with
// data.F1 and data.ExactMatch against the golden answers.
//
// It resumes: pairs already in the file with a reply are skipped; pairs
// whose call failed are asked again, the newer line winning. dir/pool.json
// names the pool; a folder of another pool is refused (ErrOtherPool), so
// outcomes of two pools never mix. Calls go chunk by chunk through
// Pool.CallBatch; each chunk is appended in one write, so a kill loses at
// most the chunk in flight, and a torn last line is skipped when read.
// When ctx ends, the calls it cut short are not recorded and ctx's error is
// returned.
func Collect(ctx context.Context, dir string, o CollectOptions) (CollectStats, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.Chunk <= 0 {
		o.Chunk = 256
	}
	if o.Extract == nil {
		return CollectStats{}, errors.New("baselines: collect: no answer extraction given")
	}
	if err := claimFolder(dir, o.Info); err != nil {
		return CollectStats{}, err
	}
	done, err := readOutcomes(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return CollectStats{}, err
	}
	type job struct {
		q     data.Example
		model string
	}
	var jobs []job
	st := CollectStats{}
	for _, q := range o.Questions {
		for _, m := range o.Info.Models {
			st.Pairs++
			if prev, ok := done[[2]string{q.ID, m.Name}]; ok && !prev.Failed {
				st.Skipped++
				continue
			}
			jobs = append(jobs, job{q, m.Name})
		}
	}
	if st.Skipped > 0 {
		o.Log.Info("collect: resuming", "dir", dir, "done", st.Skipped, "left", len(jobs))
	}
	f, err := openAppend(filepath.Join(dir, OutcomesFile))
	if err != nil {
		return st, err
	}
	defer f.Close()
	firstErr := "" // the first failed call's error
	for lo := 0; lo < len(jobs); lo += o.Chunk {
		part := jobs[lo:min(lo+o.Chunk, len(jobs))]
		reqs := make([]llmpool.Request, len(part))
		for i, j := range part {
			q := llmpool.Question{ID: j.q.ID, Dataset: j.q.Dataset, Text: j.q.Question, Golden: j.q.Golden}
			reqs[i] = llmpool.Request{Model: j.model, Query: j.q.Question, Question: &q}
		}
		resps := o.Pool.CallBatch(ctx, reqs)
		var buf bytes.Buffer
		for i, r := range resps {
			if r.Failed && (errors.Is(r.Err, context.Canceled) || errors.Is(r.Err, context.DeadlineExceeded)) && ctx.Err() != nil {
				continue // cut short by the end of ctx, not an outcome
			}
			j := part[i]
			out := Outcome{QuestionID: j.q.ID, Dataset: j.q.Dataset, Question: j.q.Question, Golden: j.q.Golden,
				Model: j.model, Reply: r.Text, Evidence: r.Evidence, InputTokens: r.InputTokens, OutputTokens: r.OutputTokens,
				TokensEstimated: r.TokensEstimated, Cost: r.Cost, LatencyMS: float64(r.Latency.Microseconds()) / 1000,
				Cached: r.Cached, Failed: r.Failed}
			if r.Failed {
				st.Failed++
				if r.Err != nil {
					out.Error = r.Err.Error()
					if firstErr == "" {
						firstErr = out.Error
					}
				}
			} else {
				out.Answer = o.Extract(r.Text)
				out.F1, out.EM = data.F1(out.Answer, j.q.Golden), data.ExactMatch(out.Answer, j.q.Golden)
			}
			b, err := json.Marshal(out)
			if err != nil {
				return st, fmt.Errorf("baselines: collect: question %s, model %s: %w", j.q.ID, j.model, err)
			}
			buf.Write(b)
			buf.WriteByte('\n')
			st.Asked++
		}
		if _, err := f.Write(buf.Bytes()); err != nil {
			return st, fmt.Errorf("baselines: collect: %w", err)
		}
		if err := ctx.Err(); err != nil {
			return st, err
		}
		if o.Progress != nil {
			o.Progress(st.Skipped+lo+len(part), st.Pairs)
		}
	}
	if st.Failed > 0 && st.Failed == st.Asked {
		// Nothing was collected: a key or an endpoint that cannot work,
		// not a flaky call. The failures are in the file, asked again on
		// the next run.
		return st, fmt.Errorf("%w: all %d calls (first: %s)", ErrAllFailed, st.Failed, firstErr)
	}
	if st.Failed > 0 {
		o.Log.Warn("collect: some calls failed; they score 0 and are asked again on the next run", "failed", st.Failed)
	}
	return st, nil
}

// ErrAllFailed: every call of a collect failed, so it collected nothing.
var ErrAllFailed = errors.New("baselines: collect: every call failed; check the pool's API keys and endpoints")

// claimFolder makes dir hold the outcomes of pool info: pool.json is
// written if absent and must name the same pool if present.
func claimFolder(dir string, info PoolInfo) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("baselines: collect: %w", err)
	}
	old, err := readPool(dir)
	switch {
	case err == nil:
		if old.ID != info.ID {
			return fmt.Errorf("%w: %s holds outcomes of pool %s (models %s), this pool is %s (models %s); collect into another --out",
				ErrOtherPool, dir, short(old.ID), modelNames(old.Models), short(info.ID), modelNames(info.Models))
		}
		return nil
	case !errors.Is(err, os.ErrNotExist):
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, OutcomesFile)); err == nil {
		return fmt.Errorf("%w: %s has %s but no %s naming its pool; collect into another --out", ErrOtherPool, dir, OutcomesFile, PoolFile)
	}
	return atomicfile.Write(filepath.Join(dir, PoolFile), func(w io.Writer) error {
		e := json.NewEncoder(w)
		e.SetIndent("", "  ")
		return e.Encode(info)
	})
}

// openAppend opens the outcomes file for appending, first ending a torn
// last line so that new lines start on a line of their own.
func openAppend(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("baselines: collect: %w", err)
	}
	st, err := f.Stat()
	if err == nil && st.Size() > 0 {
		last := make([]byte, 1)
		if _, err = f.ReadAt(last, st.Size()-1); err == nil && last[0] != '\n' {
			_, err = f.Write([]byte{'\n'})
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("baselines: collect: %w", err)
	}
	return f, nil
}

func short(id string) string {
	s := strings.TrimPrefix(id, "sha256:")
	return s[:min(12, len(s))]
}

func modelNames(ms []ModelInfo) string {
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = m.Name
	}
	return strings.Join(names, ", ")
}
