// Command serve is the load benchmark of `recal serve`: it starts the real
// server (bin/recal serve) with a policy checkpoint and a pool of simulated
// models that answer in -latency, then sends the same questions one at a
// time and from -clients concurrent clients (-requests each), and reports
// throughput (target: concurrent ≥ 8× sequential), p50/p99 latency, errors
// (target: none) and the server's resident memory (target: flat within 10%
// from after the warm-up to the end). `make bench` runs it.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/data"
)

func main() {
	bin := flag.String("recal", "bin/recal", "the recal binary")
	cfgPath := flag.String("config", "recal.toml", "configuration whose pool is made to answer in -latency")
	ck := flag.String("checkpoint", "", "policy checkpoint to serve (default: runs/recal/checkpoints/last if make train made it, else a short warm-up of runs/init/tiny, made once in runs/bench-serve)")
	latency := flag.Duration("latency", 300*time.Millisecond, "simulated pool latency")
	clients := flag.Int("clients", 64, "concurrent clients")
	requests := flag.Int("requests", 4, "requests per concurrent client")
	maxBatch := flag.Int("max-batch", 64, "serve.max_batch")
	threads := flag.Int("threads", 0, "libtorch CPU threads (0 = all cores)")
	flag.Parse()
	if *ck == "" {
		var err error
		if *ck, err = warmPolicy(*bin, *cfgPath, *threads); err != nil {
			fmt.Fprintln(os.Stderr, "bench serve:", err)
			os.Exit(1)
		}
	}
	if err := run(*bin, *cfgPath, *ck, *latency, *clients, *requests, *maxBatch, *threads); err != nil {
		fmt.Fprintln(os.Stderr, "bench serve:", err)
		os.Exit(1)
	}
}

// warmPolicy returns a checkpoint that writes the protocol and calls the
// pool, so that the pool's latency is part of what is measured (the random
// runs/init/tiny never calls it): make train's, or else a supervised
// warm-up of runs/init/tiny (200 steps, about a minute on 2 cores), made
// once.
func warmPolicy(bin, cfgPath string, threads int) (string, error) {
	for _, ck := range []string{"runs/recal/checkpoints/last", "runs/bench-serve/checkpoints/sft"} {
		if _, err := os.Stat(filepath.Join(ck, "model.safetensors")); err == nil {
			return ck, nil
		}
	}
	fmt.Println("warming up runs/init/tiny for the serve benchmark (200 supervised steps, once, into runs/bench-serve)")
	os.RemoveAll("runs/bench-serve")
	args := []string{"train", "--config", cfgPath, "--run-dir", "runs/bench-serve", "--set", "policy.checkpoint=runs/init/tiny",
		"--set", "sft.steps=200", "--set", "train.steps=0"}
	if threads > 0 {
		args = append([]string{"--threads", strconv.Itoa(threads)}, args...)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("warm-up: %s: %w", strings.Join(cmd.Args, " "), err)
	}
	return "runs/bench-serve/checkpoints/sft", nil
}

// result is one request's outcome.
type result struct {
	latency time.Duration
	err     error
	answer  string
	calls   int
}

func run(bin, cfgPath, ck string, latency time.Duration, clients, requests, maxBatch, threads int) (err error) {
	// Absolute paths: the config is written again into a temporary folder.
	if cfgPath, err = filepath.Abs(cfgPath); err != nil {
		return err
	}
	if ck, err = filepath.Abs(ck); err != nil {
		return err
	}
	cfg, err := config.Load(cfgPath, []string{"policy.checkpoint=" + ck})
	if err != nil {
		return err
	}
	n := clients * requests
	cfg.Data.Test = []string{"nq", "hotpotqa"}
	cfg.Data.TestPerDataset = (n + 1) / 2
	qs, err := cfg.Data.LoadTest()
	if err != nil {
		return err
	}
	if len(qs) < n {
		return fmt.Errorf("%d test questions, want %d", len(qs), n)
	}
	qs = qs[:n]
	for i := range cfg.Pool.Models {
		if m := &cfg.Pool.Models[i]; m.Sim != nil {
			m.Sim.Latency = latency
		}
	}
	cfg.Serve.MaxBatch, cfg.Serve.MaxQueue = maxBatch, max(cfg.Serve.MaxQueue, clients)
	cfg.Serve.RequestTimeout = 10 * time.Minute
	dir, err := os.MkdirTemp("", "recal-bench-serve")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	conf := filepath.Join(dir, "config.toml")
	if err := cfg.Write(conf); err != nil {
		return err
	}

	args := []string{"--log-level", "warn", "serve", "--config", conf, "--checkpoint", ck, "--addr", "127.0.0.1:0"}
	if threads > 0 {
		args = append([]string{"--threads", strconv.Itoa(threads)}, args...)
	}
	srv := exec.Command(bin, args...)
	srv.Stderr = os.Stderr
	out, err := srv.StdoutPipe()
	if err != nil {
		return err
	}
	if err := srv.Start(); err != nil {
		return err
	}
	defer srv.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		return fmt.Errorf("recal serve printed no URL: %w", err)
	}
	base := strings.TrimSpace(line)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: clients}}
	rss := func() float64 { return rssMiB(srv.Process.Pid) }
	fmt.Printf("recal serve %s: checkpoint %s, pool latency %s, max_batch %d, %d questions\n", base, ck, latency, maxBatch, n)
	rssLoaded := rss()

	// Warm-up: the concurrent run once, so that the KV cache of every row and
	// the allocator's pools for every tensor shape exist before memory is
	// compared.
	warm := fire(client, base, qs, clients)
	if e := errorsOf(warm); e > 0 {
		return fmt.Errorf("warm-up: %d errors, first: %v", e, firstErr(warm))
	}
	rssWarm := rss()

	cpu := func() float64 { return cpuSeconds(srv.Process.Pid) }
	cpu0 := cpu()
	start := time.Now()
	seq := fire(client, base, qs, 1)
	seqWall := time.Since(start)
	rssSeq := rss()
	cpu1 := cpu()
	start = time.Now()
	conc := fire(client, base, qs, clients)
	concWall := time.Since(start)
	rssEnd := rss()
	cpu2 := cpu()
	load := loadAverage()

	srv.Process.Signal(syscall.SIGTERM)
	waitErr := srv.Wait()

	same := 0
	for i := range seq {
		if seq[i].err == nil && conc[i].err == nil && seq[i].answer == conc[i].answer {
			same++
		}
	}
	calls := 0
	for _, r := range conc {
		calls += r.calls
	}
	seqRate, concRate := float64(n)/seqWall.Seconds(), float64(n)/concWall.Seconds()
	fmt.Printf("\n%-34s %10s %10s %10s %8s\n", "", "req/s", "p50", "p99", "errors")
	fmt.Printf("%-34s %10.2f %10s %10s %8d\n", "one at a time", seqRate, pct(seq, 50), pct(seq, 99), errorsOf(seq))
	fmt.Printf("%-34s %10.2f %10s %10s %8d\n", fmt.Sprintf("%d clients × %d requests", clients, requests), concRate, pct(conc, 50), pct(conc, 99), errorsOf(conc))
	ratio := concRate / seqRate
	fmt.Printf("\nthroughput: %.1f× one at a time (target ≥ 8×: %s); %.2f pool calls per question\n", ratio, verdict(ratio >= 8), float64(calls)/float64(n))
	fmt.Printf("answers identical in both runs (temperature 0): %d of %d\n", same, n)
	fmt.Printf("server CPU time per request: %.0f ms one at a time, %.0f ms concurrently (%.1f× less); machine load average at the end %s\n",
		1000*(cpu1-cpu0)/float64(n), 1000*(cpu2-cpu1)/float64(n), (cpu1-cpu0)/max(cpu2-cpu1, 1e-9), load)
	growth := rssEnd/rssWarm - 1
	fmt.Printf("server RSS: %.0f MiB loaded, %.0f MiB after the warm-up, %.0f MiB after the sequential run, %.0f MiB at the end: %+.1f%% since the warm-up (target within ±10%%: %s)\n",
		rssLoaded, rssWarm, rssSeq, rssEnd, 100*growth, verdict(growth <= 0.10 && growth >= -0.10))
	fmt.Printf("SIGTERM: %s\n", exitText(waitErr))
	if errorsOf(seq)+errorsOf(conc) > 0 {
		return fmt.Errorf("%d requests failed, first: %v", errorsOf(seq)+errorsOf(conc), firstErr(append(seq, conc...)))
	}
	return nil
}

// fire sends one request per question from `clients` goroutines and
// returns the outcomes in question order.
func fire(client *http.Client, base string, qs []data.Example, clients int) []result {
	out := make([]result, len(qs))
	next := make(chan int)
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				out[i] = ask(client, base, qs[i].Question)
			}
		}()
	}
	for i := range qs {
		next <- i
	}
	close(next)
	wg.Wait()
	return out
}

func ask(client *http.Client, base, question string) result {
	body, _ := json.Marshal(map[string]any{"messages": []map[string]string{{"role": "user", "content": question}}, "temperature": 0})
	start := time.Now()
	resp, err := client.Post(base+"/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	r := result{latency: time.Since(start), err: err}
	if err == nil && resp.StatusCode != http.StatusOK {
		r.err = fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	var c struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
		Recal struct {
			Trace []json.RawMessage `json:"trace"`
		} `json:"recal"`
	}
	if r.err == nil {
		if err := json.Unmarshal(b, &c); err != nil || len(c.Choices) != 1 {
			r.err = fmt.Errorf("not a chat completion: %s", b)
		} else {
			r.answer, r.calls = c.Choices[0].Message.Content, len(c.Recal.Trace)
		}
	}
	return r
}

func pct(rs []result, p int) string {
	var ds []time.Duration
	for _, r := range rs {
		if r.err == nil {
			ds = append(ds, r.latency)
		}
	}
	if len(ds) == 0 {
		return "-"
	}
	slices.Sort(ds)
	i := min(len(ds)-1, (len(ds)*p+99)/100-1)
	return ds[max(i, 0)].Round(time.Millisecond).String()
}

func errorsOf(rs []result) int {
	n := 0
	for _, r := range rs {
		if r.err != nil {
			n++
		}
	}
	return n
}

func firstErr(rs []result) error {
	for _, r := range rs {
		if r.err != nil {
			return r.err
		}
	}
	return nil
}

// rssMiB reads a process's resident set size from /proc.
func rssMiB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			return kb / 1024
		}
	}
	return 0
}

// cpuSeconds reads a process's user and system CPU time from /proc (in
// clock ticks of 1/100 s, Linux's USER_HZ).
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100
}

// loadAverage is the first three fields of /proc/loadavg: the benchmark
// shares the machine, and CPU-bound rows slow down with it.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

func exitText(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}
