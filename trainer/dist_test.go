package trainer_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/recal-project/recal/internal/procgroup"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/internal/testing/ranktest"
	"github.com/recal-project/recal/trainer"
)

// The data-parallel tests re-run this test binary as one process per rank,
// each running only TestTrainRankHelper with torchrun's variables and the
// job in these.
const (
	rankHelperEnv = "RECAL_TRAIN_RANK_HELPER" // the run folder
	rankCkEnv     = "RECAL_TRAIN_RANK_CK"     // the policy checkpoint
	rankSetsEnv   = "RECAL_TRAIN_RANK_SETS"   // extra --set keys, joined by "|"
)

// distSets make the micro-batches of one process and of two ranks the same
// sequences (two responses per rank, micro_batch 2), so the loss statistics
// sum the same terms in the same order.
var distSets = []string{"policy.threads=1", "train.micro_batch=2", "train.batch_size=2", "train.group_size=2",
	"sft.batch_size=4", "data.val_per_dataset=3", "dist.timeout=60s"}

// launchRanks starts world ranks of a training job on loopback, with
// environment variables env and extra --set keys sets.
func launchRanks(t *testing.T, ctx context.Context, run, ck string, world int, env []string, sets ...string) ([]*exec.Cmd, []*bytes.Buffer) {
	t.Helper()
	vars := append([]string{rankHelperEnv + "=" + run, rankCkEnv + "=" + ck, rankSetsEnv + "=" + strings.Join(sets, "|")}, env...)
	return ranktest.Launch(t, ctx, "TestTrainRankHelper", world, ranktest.FreePort(t), vars...)
}

// TestTrainRankHelper is not a test: it is one rank of a job launched by
// launchRanks. With RECAL_TRAIN_RANK_KILL_AFTER=k, rank 1 kills itself
// (SIGKILL) once rank 0 has logged and checkpointed step k, in the middle
// of step k+1, having written the time (Unix nanoseconds) to the file
// <run>.killed-at.
func TestTrainRankHelper(t *testing.T) {
	run := os.Getenv(rankHelperEnv)
	if run == "" {
		t.Skip("run by the data-parallel tests")
	}
	var sets []string
	if s := os.Getenv(rankSetsEnv); s != "" {
		sets = strings.Split(s, "|")
	}
	cfg := testConfig(t, os.Getenv(rankCkEnv), append(append([]string{}, distSets...), sets...)...)
	if err := rollout.SetThreads(1); err != nil {
		t.Fatal(err)
	}
	l, err := procgroup.FromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if k, err := strconv.Atoi(os.Getenv("RECAL_TRAIN_RANK_KILL_AFTER")); err == nil && l.Rank == 1 {
		go func() {
			// Step k is logged and checkpointed: the ranks are past its
			// barrier, rolling out step k+1.
			for {
				last, _ := os.Readlink(filepath.Join(run, "checkpoints", "last"))
				if b, err := os.ReadFile(filepath.Join(run, "metrics.jsonl")); err == nil && bytes.Count(b, []byte("\n")) >= k && last == fmt.Sprintf("step-%d", k) {
					time.Sleep(100 * time.Millisecond)
					os.WriteFile(run+".killed-at", []byte(strconv.FormatInt(time.Now().UnixNano(), 10)), 0o644)
					syscall.Kill(os.Getpid(), syscall.SIGKILL)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	ctx := context.Background()
	g, err := trainer.JoinGroup(ctx, l, cfg.Dist, "cpu")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	// With RECAL_TRAIN_RANK_DEBUG=1 the rank logs at debug level: the
	// rows it backpropagates of each mini-batch.
	log := slog.Default()
	if os.Getenv("RECAL_TRAIN_RANK_DEBUG") == "1" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	err = trainer.Train(ctx, cfg.Training(), trainer.Options{RunDir: run, Group: g, Resume: os.Getenv("RECAL_TRAIN_RANK_RESUME") == "1", Log: log})
	if err != nil {
		fmt.Printf("rank %d: train: %v\n", l.Rank, err)
		t.Fatal(err)
	}
}

// Data parallelism end to end, on loopback:
//   - two ranks compute what one process computes: the same warm-up and
//     validation logs, the same rollouts (responses, raw rewards,
//     advantages) and metrics, weights equal up to float summation orders;
//     only rank 0 writes;
//   - a rank killed (SIGKILL) in the middle of a step makes the other exit
//     non-zero within dist.timeout, naming the lost rank;
//   - --resume then finishes with two ranks, exactly as the uninterrupted
//     two-rank run, and with one;
//   - with train.mini_batches = 2 every rank backpropagates its share of
//     each mini-batch, and two ranks still compute what one process
//     computes.
func TestTrainDataParallel(t *testing.T) {
	if os.Getenv(rankHelperEnv) != "" {
		t.Skip("inside a helper rank")
	}
	if err := rollout.SetThreads(1); err != nil {
		t.Fatal(err)
	}
	ck := microCheckpoint(t)
	// Every prompt lists a random subset of the pool (train.model_subsets):
	// the ranks draw what one process draws.
	sets := []string{"train.steps=4", "train.checkpoint_every=1", "train.model_subsets=1"}
	ranksWith := func(t *testing.T, run string, sets []string, env ...string) ([]error, []string, time.Duration) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmds, outs := launchRanks(t, ctx, run, ck, 2, env, sets...)
		errs := make([]error, len(cmds))
		texts := make([]string, len(cmds))
		var took time.Duration
		start := time.Now()
		for r, cmd := range cmds {
			errs[r] = cmd.Wait()
			texts[r] = outs[r].String()
			if r == 0 {
				took = time.Since(start)
			}
		}
		return errs, texts, took
	}
	ranks := func(t *testing.T, run string, env ...string) ([]error, []string, time.Duration) {
		t.Helper()
		return ranksWith(t, run, sets, env...)
	}
	one := filepath.Join(t.TempDir(), "one")
	if err := trainer.Train(context.Background(), testConfig(t, ck, append(append([]string{}, distSets...), sets...)...).Training(), trainer.Options{RunDir: one}); err != nil {
		t.Fatal(err)
	}
	two := filepath.Join(t.TempDir(), "two")
	errs, outs, _ := ranks(t, two)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v\n%s", r, err, outs[r])
		}
	}
	t.Run("two ranks compute what one process computes", func(t *testing.T) {
		compareRuns(t, one, two, match{exactUpTo: 4, weights: map[string]float64{"sft": 0, "step-1": 0, "step-4": 0}})
	})
	// The KL reference reloaded each step too (policy.reload_reference),
	// the gradient buckets zeroed by giving their pages back, and the
	// gradient sums sharded (ZeRO-2), reduced layer by layer in each
	// update's last backward.
	t.Run("sharded optimizer and gradients, checkpointed layers and a reloaded reference compute what one process computes", func(t *testing.T) {
		sharded := filepath.Join(t.TempDir(), "sharded")
		errs, outs, _ := ranksWith(t, sharded, append(append([]string{}, sets...), "dist.shard_optimizer=true", "dist.shard_gradients=true",
			"policy.gradient_checkpointing=true", "policy.reload_reference=true"))
		for r, err := range errs {
			if err != nil {
				t.Fatalf("rank %d: %v\n%s", r, err, outs[r])
			}
		}
		compareRuns(t, one, sharded, match{exactUpTo: 4, weights: map[string]float64{"sft": 0, "step-1": 0, "step-4": 0}})
		for _, ck := range []string{"step-1", "step-4"} {
			a, err := os.ReadFile(filepath.Join(two, "checkpoints", ck, "optimizer.safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(filepath.Join(sharded, "checkpoints", ck, "optimizer.safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(a, b) {
				t.Errorf("%s: the sharded run's optimizer checkpoint (gathered whole) differs from the unsharded two-rank run's", ck)
			}
		}
	})

	killed := filepath.Join(t.TempDir(), "killed")
	t.Run("a rank killed in a step stops the other, naming it", func(t *testing.T) {
		errs, outs, took := ranks(t, killed, "RECAL_TRAIN_RANK_KILL_AFTER=2")
		exited := time.Now() // rank 0's exit: rank 1 was dead before it
		var ee *exec.ExitError
		if !errors.As(errs[1], &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("rank 1: %v, want killed by SIGKILL after step 2\n%s", errs[1], outs[1])
		}
		if errs[0] == nil {
			t.Fatalf("rank 0 exited 0 after rank 1 was killed; want a failure\n%s", outs[0])
		}
		t.Logf("rank 0 exited %v after %v; its error: %s", errs[0], took.Round(time.Millisecond), lastLine(outs[0], "train:"))
		if !strings.Contains(outs[0], "lost rank 1 (") {
			t.Errorf("rank 0's error does not name the lost rank (want \"lost rank 1 (\"):\n%s", outs[0])
		}
		// Rank 0 notices the lost connection at once, or at the latest when
		// its collective times out (dist.timeout = 60 s); then it stops. The
		// bound counts from the kill, not from the launch, so a loaded
		// machine's slower steps do not count against it.
		b, err := os.ReadFile(killed + ".killed-at")
		if err != nil {
			t.Fatalf("rank 1 wrote no kill time: %v", err)
		}
		at, err := strconv.ParseInt(string(b), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if stop := exited.Sub(time.Unix(0, at)); stop > 75*time.Second {
			t.Errorf("rank 0 stopped %v after rank 1 was killed, want at most dist.timeout (60 s) and 15 s to stop", stop.Round(time.Millisecond))
		}
		for _, f := range []string{"metrics.jsonl", "rollouts.jsonl"} {
			if n := len(readJSONL(t, filepath.Join(killed, f))); n == 0 {
				t.Errorf("%s is empty after 2 steps", f)
			}
		}
	})
	resumed1 := filepath.Join(t.TempDir(), "resumed1")
	if err := os.CopyFS(resumed1, os.DirFS(killed)); err != nil {
		t.Fatal(err)
	}
	t.Run("--resume with two ranks finishes as the uninterrupted run", func(t *testing.T) {
		errs, outs, _ := ranks(t, killed, "RECAL_TRAIN_RANK_RESUME=1")
		for r, err := range errs {
			if err != nil {
				t.Fatalf("rank %d of the resume: %v\n%s", r, err, outs[r])
			}
		}
		compareRuns(t, two, killed, match{exactUpTo: 4, weights: map[string]float64{"step-4": 0}})
	})
	t.Run("--resume with one process finishes", func(t *testing.T) {
		cfg := testConfig(t, ck, append(append([]string{}, distSets...), sets...)...)
		if err := trainer.Train(context.Background(), cfg.Training(), trainer.Options{RunDir: resumed1, Resume: true}); err != nil {
			t.Fatal(err)
		}
		compareRuns(t, two, resumed1, match{exactUpTo: 4, weights: map[string]float64{"step-4": 0}})
	})

	t.Run("mini_batches = 2: both ranks work in every mini-batch, as one process", func(t *testing.T) {
		// Mini-batch m holds response m of each group (group_size 2), so
		// each rank holds one response of each; micro_batch 1 makes one
		// process's micro-batches those same responses.
		mb := []string{"train.steps=2", "train.checkpoint_every=1", "train.mini_batches=2", "train.micro_batch=1"}
		one := filepath.Join(t.TempDir(), "one-mb2")
		if err := trainer.Train(context.Background(), testConfig(t, ck, append(append([]string{}, distSets...), mb...)...).Training(), trainer.Options{RunDir: one}); err != nil {
			t.Fatal(err)
		}
		two := filepath.Join(t.TempDir(), "two-mb2")
		errs, outs, _ := ranksWith(t, two, mb, "RECAL_TRAIN_RANK_DEBUG=1")
		for r, err := range errs {
			if err != nil {
				t.Fatalf("rank %d: %v\n%s", r, err, outs[r])
			}
		}
		line := regexp.MustCompile(`msg=mini-batch step=(\d+) mini_batch=(\d+) of=(\d+) rank=(\d+) rows=(\d+)`)
		for r, out := range outs {
			rows := map[[2]int]int{} // (step, mini-batch) → this rank's rows
			for _, m := range line.FindAllStringSubmatch(out, -1) {
				step, _ := strconv.Atoi(m[1])
				mbi, _ := strconv.Atoi(m[2])
				of, _ := strconv.Atoi(m[3])
				rank, _ := strconv.Atoi(m[4])
				n, _ := strconv.Atoi(m[5])
				if of != 2 || rank != r {
					t.Errorf("rank %d logged mini-batch %d of %d as rank %d; want 2 mini-batches per step, logged by rank %d", r, mbi, of, rank, r)
				}
				rows[[2]int{step, mbi}] = n
			}
			ok := true
			for step := 1; step <= 2; step++ {
				for mbi := 1; mbi <= 2; mbi++ {
					if n := rows[[2]int{step, mbi}]; n != 1 {
						ok = false
						t.Errorf("rank %d backpropagated %d rows of step %d's mini-batch %d, want 1 (its share: one response of its group); a rank without rows idles at the all-reduce",
							r, n, step, mbi)
					}
				}
			}
			if !ok {
				t.Logf("rank %d's output:\n%s", r, out)
			}
		}
		compareRuns(t, one, two, match{exactUpTo: 2, weights: map[string]float64{"step-1": 0, "step-2": 0}})
	})
}

// lastLine is the last line of out holding marker.
func lastLine(out, marker string) string {
	lines := strings.Split(out, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], marker) {
			return strings.TrimSpace(lines[i])
		}
	}
	return ""
}

// lossMetrics are the metrics computed from the policy's log-probabilities.
// With a micro-batch that falls whole on one rank (train.micro_batch
// divides a rank's rows) they are exact between one process and N ranks:
// decoding with log-probs gives a row the same bits whatever rows share its
// call (cgo/recal_rows.cc, the row-invariant kernels), and a micro-batch's gradient is summed
// whole before it is added to the others, as the all-reduce adds the
// ranks'. match.loss loosens them for other layouts.
var lossMetrics = map[string]bool{"loss": true, "entropy": true, "kl": true, "ratio": true, "clip_frac": true, "grad_norm": true}

// match says how closely two runs must agree.
type match struct {
	// exactUpTo is the last step whose rollouts and metrics must match;
	// later steps are compared by their questions, groups and samples
	// only.
	exactUpTo int
	// loss bounds the relative difference of lossMetrics; 0 = exact.
	loss float64
	// weights bounds |a − b| of each named checkpoint's weights.
	weights map[string]float64
}

// compareRuns checks that run b logged what run a logged, timings aside,
// and holds the same checkpoints, as closely as m says.
func compareRuns(t *testing.T, a, b string, m match) {
	t.Helper()
	timing := map[string]bool{"step_time_s": true, "rollout_time_s": true, "score_time_s": true, "update_time_s": true, "tokens_per_s": true, "latency_ns": true}
	structure := map[string]bool{"step": true, "question_id": true, "group": true, "sample": true, "dataset": true}
	for _, f := range []string{"sft.jsonl", "rollouts.jsonl", "metrics.jsonl", "validation.jsonl"} {
		la, lb := readJSONL(t, filepath.Join(a, f)), readJSONL(t, filepath.Join(b, f))
		if len(la) != len(lb) {
			t.Fatalf("%s: %d lines against %d", f, len(la), len(lb))
		}
		worst := 0.0
		for i := range la {
			x, y := dropKeys(la[i], timing).(map[string]any), dropKeys(lb[i], timing).(map[string]any)
			step, _ := x["step"].(float64)
			if x["stage"] != "sft" && step > float64(m.exactUpTo) {
				for _, v := range []map[string]any{x, y} {
					for k := range v {
						if !structure[k] {
							delete(v, k)
						}
					}
				}
			}
			if f == "metrics.jsonl" && m.loss > 0 && step <= float64(m.exactUpTo) {
				for k := range lossMetrics {
					u, v := x[k].(float64), y[k].(float64)
					worst = math.Max(worst, math.Abs(u-v)/math.Max(math.Max(math.Abs(u), math.Abs(v)), 1e-12))
					delete(x, k)
					delete(y, k)
				}
			}
			if !reflect.DeepEqual(x, y) {
				t.Errorf("%s line %d differs (the ranks must compute what one process computes):\n %s: %v\n %s: %v", f, i+1, filepath.Base(a), x, filepath.Base(b), y)
			}
		}
		if f == "metrics.jsonl" && m.loss > 0 {
			t.Logf("metrics.jsonl up to step %d: loss, entropy, kl, ratio, clip_frac, grad_norm agree to a relative %.3g; the rest exactly", m.exactUpTo, worst)
			if worst > m.loss {
				t.Errorf("metrics.jsonl: a loss metric differs by a relative %g, want ≤ %g", worst, m.loss)
			}
		}
	}
	for ck, bound := range m.weights {
		wa, wb := weights(t, filepath.Join(a, "checkpoints", ck)), weights(t, filepath.Join(b, "checkpoints", ck))
		worst := 0.0
		for name, va := range wa {
			vb := wb[name]
			if len(va) != len(vb) {
				t.Fatalf("%s: %d values against %d", name, len(va), len(vb))
			}
			for i := range va {
				worst = math.Max(worst, math.Abs(float64(va[i]-vb[i])))
			}
		}
		t.Logf("checkpoint %s: max |%s − %s| = %.3g", ck, filepath.Base(a), filepath.Base(b), worst)
		if worst > bound {
			t.Errorf("checkpoint %s: weights differ by up to %g, want ≤ %g", ck, worst, bound)
		}
	}
}

// dropKeys copies v without the given keys, at any depth.
func dropKeys(v any, keys map[string]bool) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			if !keys[k] {
				out[k] = dropKeys(e, keys)
			}
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = dropKeys(e, keys)
		}
		return out
	}
	return v
}

// weights reads a checkpoint's float32 tensors.
func weights(t *testing.T, dir string) map[string][]float32 {
	t.Helper()
	out := map[string][]float32{}
	for name, b := range params(t, dir) {
		v := make([]float32, len(b)/4)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		out[name] = v
	}
	return out
}
