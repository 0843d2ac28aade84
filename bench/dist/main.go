// Command dist measures the gradient all-reduce of torchbridge.ProcessGroup
// (c10d Gloo, 2 ranks on loopback) on the whole float32 gradient of the
// bench presets, against the same all-reduce through torch.distributed's
// gloo backend in python3-torch (bench/dist/torch_allreduce.py), in one run.
// `make bench` runs it.
//
// Both sides' ranks stay alive for the whole measurement and are driven
// through their stdin in rounds: in each round every mode of each side runs
// --per-round timed all-reduces, one mode after the other, the order
// rotating between rounds, so a change in the machine's load falls on both
// sides alike (the 2-core VM is shared). The first round is a warm-up and
// is not counted. Same buffers (the preset's parameter shapes, float32, in
// the same 25 MiB buckets), the same intra-op threads (--threads) and
// Gloo's default 2 worker threads on both sides, each all-reduce preceded by
// a barrier and timed on rank 0. Both run Gloo's ring all-reduce per bucket
// on those worker threads, every bucket started before any is waited for;
// recal's ring moves each bucket in pipeline steps of up to 4 MiB, c10d's
// (and so DDP's) in Gloo's default 1 MiB, which c10d does not expose (see
// torchbridge.ProcessGroup.AllReduceGrads). The same bytes cross the same
// sockets.
//
// Modes (recal / torch.distributed):
//
//	recal grads      fresh gradients (a backward outside the timer, which
//	                 adds them into the buckets where the policy keeps its
//	                 gradient sums), then the buckets' all-reduces: what a
//	                 training step's all-reduce does.
//	recal views      the same after an extra untimed all-reduce: the
//	                 buckets' all-reduces alone, with an all-reduce rather
//	                 than a backward just before.
//	torch views      the same buckets, gradients as their views (DDP's
//	                 gradient_as_bucket_view=True): the all-reduces alone.
//	torch bucketed   copy in, async all-reduce per bucket, copy back (DDP's
//	                 default reducer).
//	torch flatten    _flatten_dense_tensors, one all_reduce, copy back.
//	torch flat       one preallocated buffer, one all_reduce.
//
// It prints, per preset and mode, the median time, the interquartile range
// and min–max over every timed all-reduce, the bandwidth (gradient bytes /
// median), and the ratios torch / recal of the modes that do the same
// communication, as the ratio of the medians and the median of the
// per-round ratios (target ≥ 1.0×).
//
// The parent re-executes itself as each recal rank (RECAL_BENCH_RANK set).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
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
	python      = flag.String("python", "/usr/bin/python3", "Python with torch for the reference; empty skips it")
	presets     = flag.String("presets", "tiny,small", "comma-separated presets")
	vocab       = flag.Int64("vocab", 151936, "vocabulary size of the presets (bench/main.go's, Qwen2.5's)")
	world       = flag.Int("world", 2, "ranks of each side, each a process on this machine")
	threads     = flag.Int("threads", 1, "intra-op CPU threads per rank, on both sides")
	rounds      = flag.Int("rounds", 10, "counted rounds (one more, first, is a warm-up)")
	perRound    = flag.Int("per-round", 3, "timed all-reduces of each mode per round")
	bucketBytes = flag.Int("bucket-bytes", 25<<20, "bucket size of both sides' all-reduce")
)

const rankEnv = "RECAL_BENCH_RANK"

func main() {
	torchbridge.UsePassiveOpenMP()
	flag.Parse()
	if r := os.Getenv(rankEnv); r != "" {
		if err := rank(r); err != nil {
			fail(err)
		}
		return
	}
	fmt.Printf("gradient all-reduce, %d ranks per side on loopback, Gloo, float32 sum, %d intra-op thread(s) per rank, "+
		"%d MiB buckets; %d rounds × %d per mode after a warm-up round, modes interleaved; %s\n",
		*world, *threads, *bucketBytes>>20, *rounds, *perRound, time.Now().Format("2006-01-02 15:04"))
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

// side is one engine's ranks, alive between commands.
type side struct {
	name  string
	cmds  []*exec.Cmd
	ins   []io.WriteCloser
	out   *bufio.Reader // rank 0's answers
	modes []string
}

// start launches world ranks of argv with env added to each rank's RANK.
func start(name string, argv []string, env []string, modes []string) (*side, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &side{name: name, modes: modes}
	for r := 0; r < *world; r++ {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(os.Environ(), env...)
		cmd.Env = append(cmd.Env, rankEnv+"="+strconv.Itoa(r), "RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(*world),
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port),
			"OMP_NUM_THREADS="+strconv.Itoa(*threads), "OMP_WAIT_POLICY=PASSIVE")
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return nil, err
		}
		if r == 0 {
			o, err := cmd.StdoutPipe()
			if err != nil {
				return nil, err
			}
			s.out = bufio.NewReader(o)
		}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		s.cmds = append(s.cmds, cmd)
		s.ins = append(s.ins, in)
	}
	return s, nil
}

// answer is rank 0's reply to one command.
type answer struct {
	Numel int64     `json:"numel"`
	Times []float64 `json:"times"`
}

// run has every rank run n all-reduces of mode and returns rank 0's times.
func (s *side) run(mode string, n int) (answer, error) {
	for r, in := range s.ins {
		if _, err := fmt.Fprintf(in, "%s %d\n", mode, n); err != nil {
			return answer{}, fmt.Errorf("%s rank %d: %w", s.name, r, err)
		}
	}
	line, err := s.out.ReadBytes('\n')
	if err != nil {
		return answer{}, fmt.Errorf("%s rank 0 (%s): %w", s.name, mode, err)
	}
	var a answer
	if err := json.Unmarshal(line, &a); err != nil {
		return answer{}, fmt.Errorf("%s rank 0: %q: %w", s.name, line, err)
	}
	return a, nil
}

func (s *side) stop() error {
	for _, in := range s.ins {
		fmt.Fprintln(in, "quit")
		in.Close()
	}
	var first error
	for r, cmd := range s.cmds {
		if err := cmd.Wait(); err != nil && first == nil {
			first = fmt.Errorf("%s rank %d: %w", s.name, r, err)
		}
	}
	return first
}

func (s *side) kill() {
	for _, cmd := range s.cmds {
		if cmd.Process != nil {
			cmd.Process.Kill()
		}
	}
}

// compare measures one preset on both sides and prints its rows.
func compare(preset string) error {
	cfg, err := hfmodel.Preset(preset, *vocab)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	var sides []*side
	defer func() {
		for _, s := range sides {
			s.kill()
		}
	}()
	ours, err := start("recal", append([]string{exe}, os.Args[1:]...), []string{"RECAL_BENCH_PRESET=" + preset}, []string{"grads", "views"})
	if err != nil {
		return err
	}
	sides = append(sides, ours)
	if *python != "" {
		dir, err := os.MkdirTemp("", "recal-bench-dist-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		shapes, err := writeShapes(cfg, dir)
		if err != nil {
			return err
		}
		_, self, _, _ := runtime.Caller(0)
		script := filepath.Join(filepath.Dir(self), "torch_allreduce.py")
		ref, err := start("torch.distributed", []string{*python, script, "--shapes", shapes, "--threads", strconv.Itoa(*threads),
			"--bucket-mib", strconv.Itoa(*bucketBytes >> 20)}, nil, []string{"views", "bucketed", "flatten", "flat"})
		if err != nil {
			return err
		}
		sides = append(sides, ref)
	}

	type key struct{ side, mode string }
	var order []key
	for _, s := range sides {
		for _, m := range s.modes {
			order = append(order, key{s.name, m})
		}
	}
	byName := map[string]*side{}
	for _, s := range sides {
		byName[s.name] = s
	}
	times := map[key][]float64{}
	perRoundMed := map[key][]float64{}
	var numel int64
	for r := 0; r <= *rounds; r++ {
		for i := range order {
			k := order[(i+r)%len(order)]
			a, err := byName[k.side].run(k.mode, *perRound)
			if err != nil {
				return err
			}
			numel = a.Numel
			if r == 0 {
				continue
			}
			times[k] = append(times[k], a.Times...)
			perRoundMed[k] = append(perRoundMed[k], median(a.Times))
		}
	}
	for _, s := range sides {
		if err := s.stop(); err != nil {
			return err
		}
	}
	sides = nil

	mb := float64(numel) * 4 / 1e6
	fmt.Printf("\npreset %s (vocab %d): %d parameters, %.1f MB of float32 gradient, %d all-reduces per mode\n",
		preset, *vocab, numel, mb, len(times[order[0]]))
	fmt.Printf("  %-24s %9s %17s %17s %8s\n", "", "median ms", "p25–p75 ms", "min–max ms", "GB/s")
	for _, k := range order {
		t := slices.Clone(times[k])
		slices.Sort(t)
		fmt.Printf("  %-24s %9.1f %17s %17s %8.2f\n", k.side+" "+k.mode, median(t)*1e3,
			fmt.Sprintf("%.1f–%.1f", quantile(t, 0.25)*1e3, quantile(t, 0.75)*1e3),
			fmt.Sprintf("%.1f–%.1f", t[0]*1e3, t[len(t)-1]*1e3), mb/1e3/median(t))
	}
	if *python == "" {
		return nil
	}
	pairs := []struct {
		torch, recal string
		what         string
	}{
		{"views", "views", "the buckets' all-reduces alone (same buckets, same bytes)"},
		{"bucketed", "grads", "a step's all-reduce: DDP's reducer (copy in and back) / recal's (in place)"},
		{"views", "grads", "DDP with gradient_as_bucket_view / recal's step"},
		{"flat", "views", "one buffer / recal's buckets"},
	}
	fmt.Printf("  ratio torch / recal (≥ 1.0×: recal as fast or faster), of medians; median of the %d per-round ratios\n", *rounds)
	for _, p := range pairs {
		tk, rk := key{"torch.distributed", p.torch}, key{"recal", p.recal}
		var rr []float64
		for i := range perRoundMed[rk] {
			rr = append(rr, perRoundMed[tk][i]/perRoundMed[rk][i])
		}
		fmt.Printf("    torch %-9s / recal %-6s %6.2fx %6.2fx   %s\n", p.torch, p.recal,
			median(times[tk])/median(times[rk]), median(rr), p.what)
	}
	return nil
}

// writeShapes writes the preset's parameter shapes, in order, for the
// Python side.
func writeShapes(cfg *hfmodel.Config, dir string) (string, error) {
	p, err := torchbridge.NewPolicy(cfg, torchbridge.Options{})
	if err != nil {
		return "", err
	}
	var shapes [][]int64
	for _, pr := range p.Params() {
		shapes = append(shapes, pr.Shape)
	}
	p.Close()
	sj, _ := json.Marshal(shapes)
	path := filepath.Join(dir, "shapes.json")
	return path, os.WriteFile(path, sj, 0o644)
}

func median(t []float64) float64 { return quantile(t, 0.5) }

// quantile is the q-quantile of t by linear interpolation (numpy's default).
func quantile(t []float64, q float64) float64 {
	s := slices.Clone(t)
	slices.Sort(s)
	x := q * float64(len(s)-1)
	i := int(x)
	if i+1 >= len(s) {
		return s[len(s)-1]
	}
	return s[i] + (x-float64(i))*(s[i+1]-s[i])
}

// rank is one process of the recal side: it answers commands on stdin.
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
		Rank: rk, WorldSize: *world, MasterPort: port, Timeout: 5 * time.Minute, BucketBytes: *bucketBytes})
	if err != nil {
		return err
	}
	defer g.Close()
	// fresh gives every parameter a gradient of its own (not yet the
	// buckets'), as after a training step's backward: a short supervised
	// backward.
	seq := []int32{1, 2, 3, 4, 5, 6, 7, int32(rk + 8)}
	mask := []float32{0, 1, 1, 1, 1, 1, 1, 1}
	fresh := func() error {
		if err := p.ZeroGrad(ctx); err != nil {
			return err
		}
		_, _, err := p.BackwardNLL(ctx, [][]int32{seq}, [][]float32{mask}, 1, 0)
		return err
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		if f[0] == "quit" {
			break
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			return err
		}
		var times []float64
		for i := 0; i < n; i++ {
			if err := fresh(); err != nil {
				return err
			}
			if f[0] == "views" { // one untimed all-reduce makes the gradients the buckets' views
				if err := g.AllReduceGrads(ctx, p); err != nil {
					return err
				}
			}
			if err := g.Barrier(ctx); err != nil {
				return err
			}
			start := time.Now()
			if err := g.AllReduceGrads(ctx, p); err != nil {
				return err
			}
			times = append(times, time.Since(start).Seconds())
		}
		if rk == 0 {
			b, _ := json.Marshal(answer{Numel: p.NumParams(), Times: times})
			fmt.Println(string(b))
		}
	}
	if err := in.Err(); err != nil {
		return err
	}
	return g.Barrier(ctx)
}
