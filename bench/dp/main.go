// Command dp measures a GRPO step of recal train on the offline default
// (recal.toml) in one process with T threads against N data-parallel ranks
// with T/N threads each (recal train --nproc N), on the same machine and
// the same warmed-up policy, and prints the mean step time of each (the
// first step of a run aside: it pays for loading and the first pool
// calls), its parts (rollout, the rest: loss, backward, all-reduce, update)
// and the ratio. Both runs draw the same batches and roll out the same
// tokens, so they do the same work. `make bench` runs it.
//
// A run of recal train writes its metrics.jsonl into a temporary folder;
// the policy is the offline default's warm-up checkpoint, made first with
// --sft-steps steps unless --checkpoint names one.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

var (
	bin        = flag.String("recal", "bin/recal", "the recal binary")
	config     = flag.String("config", "recal.toml", "configuration")
	checkpoint = flag.String("checkpoint", "", "warmed-up policy to start GRPO from (default: made with --sft-steps warm-up steps)")
	sftSteps   = flag.Int("sft-steps", 150, "warm-up steps of the policy made when --checkpoint is not given")
	steps      = flag.Int("steps", 6, "GRPO steps per run (the first is not timed)")
	threads    = flag.Int("threads", 2, "CPU threads of the one process; the ranks share them")
	nproc      = flag.Int("nproc", 2, "ranks")
	rounds     = flag.Int("rounds", 1, "runs of each kind, alternated (the machine's load varies)")
)

func main() {
	flag.Parse()
	if *threads%*nproc != 0 {
		fail(fmt.Errorf("--threads %d does not split over --nproc %d", *threads, *nproc))
	}
	tmp, err := os.MkdirTemp("", "recal-bench-dp-")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(tmp)
	ck := *checkpoint
	if ck == "" {
		fmt.Fprintf(os.Stderr, "warming up a policy (%d steps)…\n", *sftSteps)
		warm := filepath.Join(tmp, "warm")
		if err := train(warm, []string{"--threads", strconv.Itoa(*threads)}, "sft.steps="+strconv.Itoa(*sftSteps), "train.steps=0"); err != nil {
			fail(err)
		}
		ck = filepath.Join(warm, "checkpoints", "sft")
	}
	kinds := []struct {
		name string
		args []string
	}{
		{fmt.Sprintf("1 process × %d threads", *threads), []string{"--threads", strconv.Itoa(*threads)}},
		{fmt.Sprintf("%d ranks × %d thread(s)", *nproc, *threads / *nproc), []string{"--threads", strconv.Itoa(*threads / *nproc), "--nproc", strconv.Itoa(*nproc)}},
	}
	var got [2][]step
	for r := 0; r < *rounds; r++ {
		for k, kind := range kinds {
			dir := filepath.Join(tmp, fmt.Sprintf("run-%d-%d", k, r))
			fmt.Fprintf(os.Stderr, "%s, round %d…\n", kind.name, r+1)
			if err := train(dir, kind.args, "policy.checkpoint="+ck, "sft.steps=0", "train.steps="+strconv.Itoa(*steps),
				"train.validate_every=0", "train.checkpoint_every=1000"); err != nil {
				fail(err)
			}
			s, err := readSteps(filepath.Join(dir, "metrics.jsonl"))
			if err != nil {
				fail(err)
			}
			got[k] = append(got[k], s[1:]...)
		}
	}
	fmt.Printf("GRPO step of %s (batch × G from the config), mean over %d steps of each, %s\n", *config, len(got[0]), time.Now().Format("2006-01-02"))
	fmt.Printf("%-26s %10s %10s %10s\n", "", "step (s)", "rollout", "rest")
	var mean [2]float64
	for k, kind := range kinds {
		var st, ro float64
		for _, s := range got[k] {
			st += s.Step / float64(len(got[k]))
			ro += s.Rollout / float64(len(got[k]))
		}
		mean[k] = st
		fmt.Printf("%-26s %10.2f %10.2f %10.2f\n", kind.name, st, ro, st-ro)
	}
	fmt.Printf("speed-up of %s: %.2f×\n", kinds[1].name, mean[0]/mean[1])
}

type step struct {
	Step    float64 `json:"step_time_s"`
	Rollout float64 `json:"rollout_time_s"`
}

func readSteps(path string) ([]step, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []step
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var s step
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, s)
	}
	if len(out) < 2 {
		return nil, fmt.Errorf("%s: %d steps, want at least 2", path, len(out))
	}
	return out, sc.Err()
}

// train runs recal train into dir with global flags pre and --set keys.
func train(dir string, pre []string, sets ...string) error {
	args := append(append([]string{}, pre[:2]...), "--log-level", "warn", "train", "--config", *config, "--run-dir", dir)
	args = append(args, pre[2:]...)
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	cmd := exec.Command(*bin, args...)
	cmd.Stdout, cmd.Stderr = nil, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %v: %w", *bin, args, err)
	}
	return nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench/dp:", err)
	os.Exit(1)
}
