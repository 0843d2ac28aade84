// Command dist measures the gradient all-reduce of torchbridge.ProcessGroup
// (c10d Gloo, 2 ranks on loopback) on the parameter shapes of the bench
// presets, and the same all-reduce through torch.distributed's gloo backend
// in python3-torch (bench/dist/torch_allreduce.py) in the same run. It
// prints, per preset, the gradient size, the median time of one all-reduce
// of the whole gradient, its bandwidth (gradient bytes / time) and the ratio
// PyTorch time / recal time for each way PyTorch is run (target ≥ 1.0× on
// the rows that do the same work: flatten and bucketed). `make bench` runs
// it.
//
// The parent re-executes itself as each rank (RECAL_BENCH_RANK set); rank 0
// prints its result as JSON.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/recal-project/recal/internal/hfmodel"
	"github.com/recal-project/recal/torchbridge"
)

var (
	python      = flag.String("python", "/usr/bin/python3", "Python with torch for the reference run; empty skips it")
	presets     = flag.String("presets", "tiny,small", "comma-separated presets")
	vocab       = flag.Int64("vocab", 151936, "vocabulary size of the presets (bench/main.go's, Qwen2.5's)")
	world       = flag.Int("world", 2, "ranks, each a process on this machine")
	threads     = flag.Int("threads", 1, "intra-op CPU threads per rank, for both engines")
	warmup      = flag.Int("warmup", 3, "untimed all-reduces")
	repeats     = flag.Int("repeats", 10, "timed all-reduces (the median is reported)")
	bucketBytes = flag.Int("bucket-bytes", 0, "recal's all-reduce bucket size (0: its default, 25 MiB)")
	bucketMiB   = flag.Int("torch-bucket-mib", 25, "the bucketed PyTorch reference's bucket size")
)

const rankEnv = "RECAL_BENCH_RANK"

// result is one engine's median seconds per all-reduce of the whole gradient.
type result struct {
	Numel    int64   `json:"numel"`
	Recal    float64 `json:"recal_s,omitempty"`
	Flat     float64 `json:"flat_s,omitempty"`
	Flatten  float64 `json:"flatten_s,omitempty"`
	Bucketed float64 `json:"bucketed_s,omitempty"`
}

func main() {
	torchbridge.UsePassiveOpenMP()
	flag.Parse()
	if r := os.Getenv(rankEnv); r != "" {
		if err := rank(r); err != nil {
			fail(err)
		}
		return
	}
	fmt.Printf("gradient all-reduce, %d ranks on loopback, Gloo, float32 sum, %d thread(s) per rank, median of %d\n",
		*world, *threads, *repeats)
	for _, name := range strings.Split(*presets, ",") {
		if err := compare(name); err != nil {
			fail(err)
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench/dist:", err)
	os.Exit(1)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// compare measures one preset with both engines and prints its rows.
func compare(preset string) error {
	cfg, err := hfmodel.Preset(preset, *vocab)
	if err != nil {
		return err
	}
	// recal: world ranks of this program.
	port, err := freePort()
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	var cmds []*exec.Cmd
	var out bytes.Buffer
	for r := 0; r < *world; r++ {
		cmd := exec.Command(exe, os.Args[1:]...)
		cmd.Env = append(os.Environ(), rankEnv+"="+strconv.Itoa(r), "RECAL_BENCH_PRESET="+preset,
			"MASTER_PORT="+strconv.Itoa(port))
		cmd.Stderr = os.Stderr
		if r == 0 {
			cmd.Stdout = &out
		}
		if err := cmd.Start(); err != nil {
			return err
		}
		cmds = append(cmds, cmd)
	}
	for r, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
	}
	var ours result
	if err := json.Unmarshal(out.Bytes(), &ours); err != nil {
		return fmt.Errorf("rank 0's result %q: %w", out.String(), err)
	}

	var ref *result
	if *python != "" {
		ref, err = reference(cfg)
		if err != nil {
			return err
		}
	}
	mb := float64(ours.Numel) * 4 / 1e6
	fmt.Printf("\npreset %s (vocab %d): %d parameters, %.1f MB of float32 gradient\n", preset, *vocab, ours.Numel, mb)
	fmt.Printf("  %-44s %10s %10s %9s\n", "", "ms", "GB/s", "vs recal")
	row := func(name string, s float64) {
		ratio := ""
		if name != "recal" {
			ratio = fmt.Sprintf("%.2fx", s/ours.Recal)
		}
		fmt.Printf("  %-44s %10.2f %10.2f %9s\n", name, s*1e3, mb/1e3/s, ratio)
	}
	row("recal", ours.Recal)
	if ref != nil {
		row("torch.distributed: flatten, all_reduce, copy", ref.Flatten)
		row("torch.distributed: 25 MiB buckets, async", ref.Bucketed)
		row("torch.distributed: one preallocated buffer", ref.Flat)
	}
	return nil
}

// reference runs bench/dist/torch_allreduce.py on the preset's shapes.
func reference(cfg *hfmodel.Config) (*result, error) {
	p, err := torchbridge.NewPolicy(cfg, torchbridge.Options{})
	if err != nil {
		return nil, err
	}
	var shapes [][]int64
	for _, pr := range p.Params() {
		shapes = append(shapes, pr.Shape)
	}
	p.Close()
	dir, err := os.MkdirTemp("", "recal-bench-dist-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	sj, _ := json.Marshal(shapes)
	path := filepath.Join(dir, "shapes.json")
	if err := os.WriteFile(path, sj, 0o644); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	_, self, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(self), "torch_allreduce.py")
	cmd := exec.Command(*python, script, "--shapes", path, "--port", strconv.Itoa(port), "--world", strconv.Itoa(*world),
		"--threads", strconv.Itoa(*threads), "--warmup", strconv.Itoa(*warmup), "--repeats", strconv.Itoa(*repeats),
		"--bucket-mib", strconv.Itoa(*bucketMiB))
	cmd.Stderr = os.Stderr
	b, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", script, err)
	}
	var r result
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: output %q: %w", script, b, err)
	}
	return &r, nil
}

// rank is one process of the recal measurement.
func rank(r string) error {
	rk, err := strconv.Atoi(r)
	if err != nil {
		return err
	}
	port, err := strconv.Atoi(os.Getenv("MASTER_PORT"))
	if err != nil {
		return err
	}
	if err := torchbridge.SetThreads(*threads); err != nil {
		return err
	}
	cfg, err := hfmodel.Preset(os.Getenv("RECAL_BENCH_PRESET"), *vocab)
	if err != nil {
		return err
	}
	ctx := context.Background()
	p, err := torchbridge.NewPolicy(cfg, torchbridge.Options{})
	if err != nil {
		return err
	}
	defer p.Close()
	if err := p.InitRandom(1, 0.02); err != nil {
		return err
	}
	g, err := torchbridge.NewProcessGroup(ctx, torchbridge.GroupOptions{
		Rank: rk, WorldSize: *world, MasterPort: port, Timeout: time.Minute, BucketBytes: *bucketBytes})
	if err != nil {
		return err
	}
	defer g.Close()
	// Each all-reduce starts from fresh gradients, as after a training
	// step's backward (outside the timer): a short supervised backward
	// gives every parameter one, in memory of its own (not yet the
	// buckets'), so the all-reduce copies them in.
	seq := []int32{1, 2, 3, 4, 5, 6, 7, int32(rk + 8)}
	mask := []float32{0, 1, 1, 1, 1, 1, 1, 1}
	var times []float64
	for i := 0; i < *warmup+*repeats; i++ {
		if err := p.ZeroGrad(ctx); err != nil {
			return err
		}
		if _, _, err := p.BackwardNLL(ctx, [][]int32{seq}, [][]float32{mask}, 1, 0); err != nil {
			return err
		}
		if err := g.Barrier(ctx); err != nil {
			return err
		}
		start := time.Now()
		if err := g.AllReduceGrads(ctx, p); err != nil {
			return err
		}
		if i >= *warmup {
			times = append(times, time.Since(start).Seconds())
		}
	}
	if err := g.Barrier(ctx); err != nil {
		return err
	}
	slices.Sort(times)
	median := (times[(len(times)-1)/2] + times[len(times)/2]) / 2 // as Python's statistics.median
	if rk == 0 {
		b, _ := json.Marshal(result{Numel: p.NumParams(), Recal: median})
		fmt.Println(string(b))
	}
	return nil
}
