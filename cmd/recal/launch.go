package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/recal-project/recal/dist"
	"github.com/recal-project/recal/rollout"
	"github.com/recal-project/recal/torchbridge"
	"github.com/recal-project/recal/trainer"
)

// Several ranks. A command that runs data-parallel (train, eval) is one
// rank of a job when a launcher set torchrun's or Slurm's variables (see
// dist.ParseEnv); with --nproc N it is the launcher itself: it starts N
// ranks of the same command on this machine, as `torchrun --standalone
// --nproc-per-node N` would.

// argv is the command line run was called with; the launcher starts its
// ranks with it, less --nproc.
var argv []string

func nprocFlag() cli.Flag {
	return &cli.IntFlag{Name: "nproc", Value: 1, Usage: "start this many data-parallel ranks on this machine (like torchrun --standalone --nproc-per-node N): " +
		"they rendezvous on loopback, split the CPU cores (unless policy.threads is set) or take one GPU each (policy.device = \"cuda\"), " +
		"and rank 0 writes the output; SIGINT/SIGTERM are passed on to every rank"}
}

// rankLaunch reads this process's place in a job from the environment,
// refusing --nproc inside a job a launcher started.
func rankLaunch(cmd *cli.Command) (dist.Launch, error) {
	l, err := dist.FromEnv()
	if err != nil {
		return l, usageError{err}
	}
	if l.Launcher != "" && cmd.Int("nproc") > 1 {
		return l, usageError{fmt.Errorf("%s: --nproc starts ranks itself, but this process already is rank %d of %d (launched by %s): drop one of them", cmd.FullName(), l.Rank, l.WorldSize, l.Launcher)}
	}
	return l, nil
}

// joinRanks joins the process group of a launch (nil for one process) and
// makes ranks other than 0 quiet: they log warnings and errors only, tagged
// with their rank, so the job shows one progress display.
func joinRanks(ctx context.Context, l dist.Launch, cmd *cli.Command, timeout time.Duration, join func() (dist.Group, error)) (dist.Group, error) {
	if !l.Distributed() {
		return nil, nil
	}
	orphanWatch()
	if l.Rank > 0 {
		lvl := slog.LevelWarn
		if cmd.Root().String("log-level") == "debug" || cmd.Root().String("log-level") == "error" {
			lvl.UnmarshalText([]byte(cmd.Root().String("log-level")))
		}
		slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl})).With("rank", l.Rank))
	}
	g, err := join()
	if err != nil {
		return nil, err
	}
	launcher := l.Launcher
	if os.Getenv(launcherEnv) != "" {
		launcher = "recal --nproc"
	}
	slog.Info("data-parallel job", "ranks", l.WorldSize, "launcher", launcher, "rendezvous", net.JoinHostPort(l.MasterAddr, strconv.Itoa(l.MasterPort)), "timeout", timeout.String())
	return g, nil
}

// rankThreads sets libtorch's CPU threads of a rank: --threads, else
// policy.threads, else this machine's cores split between its ranks
// (LOCAL_WORLD_SIZE; under Slurm each task sees only its own cores).
func rankThreads(cmd *cli.Command, configured int, l dist.Launch) error {
	if cmd.Root().IsSet("threads") {
		configured = int(cmd.Root().Int("threads"))
	}
	if l.Distributed() {
		configured = trainer.Threads(configured, trainer.LocalWorldSize())
	}
	return rollout.SetThreads(configured)
}

// launchLocal runs n ranks of this command line (less --nproc) on this
// machine and merges their exit statuses: 0 when every rank succeeded, 130
// when every rank that failed was interrupted, else the status of the first
// rank that failed (1 for a rank killed by a signal). A first SIGINT or
// SIGTERM (ctx cancelled) is passed on to every rank, which finish their
// step and save a checkpoint; the ranks die with the launcher (a second
// signal exits it at once). When a rank fails the others stop by
// themselves within timeout (dist.timeout); any still running a minute
// after that are killed.
func launchLocal(ctx context.Context, n int, timeout time.Duration) error {
	if n < 1 {
		return usageError{fmt.Errorf("--nproc %d: want at least 1", n)}
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("launch: %w", err)
	}
	args := withoutFlag(argv[1:], "nproc")
	// The launcher serves the rendezvous store itself, as torchrun's agent
	// does (the ranks join it as clients: TORCHELASTIC_USE_AGENT_STORE):
	// the kernel picks its port, and it is held from before the ranks start
	// until they end. (A port found free, released, then bound by rank 0
	// could be taken by another process in between.)
	store, err := torchbridge.ServeStore(0, timeout)
	if err != nil {
		return fmt.Errorf("launch: rendezvous store: %w", err)
	}
	defer store.Close()
	port := store.Port()
	slog.Info("starting ranks", "nproc", n, "master", "127.0.0.1:"+strconv.Itoa(port))

	type exit struct {
		rank int
		err  error
	}
	exits := make(chan exit, n)
	cmds := make([]*exec.Cmd, n)
	started := make(chan error, 1)
	// The ranks are started and waited for on one locked OS thread: their
	// parent-death signal fires when the thread that started them ends, so
	// it must live as long as they do.
	go func() {
		runtime.LockOSThread()
		for r := 0; r < n; r++ {
			c := exec.Command(exe, args...)
			c.Env = append(os.Environ(), "RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(n), "LOCAL_RANK="+strconv.Itoa(r),
				"LOCAL_WORLD_SIZE="+strconv.Itoa(n), "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port),
				"TORCHELASTIC_USE_AGENT_STORE=True", "TORCHELASTIC_RESTART_COUNT=0",
				launcherEnv+"="+strconv.Itoa(os.Getpid()))
			c.Stdin, c.Stdout, c.Stderr = nil, os.Stdout, os.Stderr
			// Their own process group: a terminal's Ctrl-C reaches the
			// launcher alone, which passes it on once. Killed with the
			// launcher, so no rank outlives it (a rank that re-executes
			// itself from another thread loses that signal: orphanWatch
			// is the second guard).
			c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
			if err := c.Start(); err != nil {
				for _, s := range cmds[:r] {
					s.Process.Kill()
				}
				started <- fmt.Errorf("launch: rank %d: %w", r, err)
				return
			}
			cmds[r] = c
		}
		started <- nil
		done := make(chan exit, n)
		for r, c := range cmds {
			go func() { done <- exit{r, c.Wait()} }()
		}
		for range n {
			exits <- <-done
		}
		select {} // keep the thread (and the parent-death signal) until the process ends
	}()
	if err := <-started; err != nil {
		return err
	}

	var first *exit // the first rank to fail
	interruptedOnly := true
	var deadline <-chan time.Time
	forwarded := false
	ended := make([]bool, n)
	for left := n; left > 0; {
		select {
		case <-ctx.Done():
			if !forwarded {
				forwarded = true
				for _, c := range cmds {
					c.Process.Signal(syscall.SIGTERM)
				}
			}
			ctx = context.Background() // forwarded once; a second signal exits the launcher (main)
		case e := <-exits:
			left--
			ended[e.rank] = true
			if e.err == nil {
				continue
			}
			code, how := exitStatus(e.err)
			if code != 130 {
				interruptedOnly = false
				fmt.Fprintf(os.Stderr, "recal: rank %d (pid %d) %s\n", e.rank, cmds[e.rank].Process.Pid, how)
			}
			if first == nil {
				first = &e
				deadline = time.After(timeout + time.Minute)
			}
		case <-deadline:
			for r, c := range cmds {
				if !ended[r] {
					fmt.Fprintf(os.Stderr, "recal: rank %d (pid %d) still running %v after rank %d failed: killed\n", r, c.Process.Pid, timeout+time.Minute, first.rank)
					c.Process.Kill()
				}
			}
			deadline = nil
		}
	}
	if first == nil {
		return nil
	}
	if interruptedOnly {
		return exitError{code: 130, err: fmt.Errorf("interrupted: every rank stopped cleanly; rerun with --resume to continue")}
	}
	code, how := exitStatus(first.err)
	return exitError{code: code, err: fmt.Errorf("rank %d of %d %s first", first.rank, n, how)}
}

// launcherEnv holds the pid of the recal --nproc that started this rank.
const launcherEnv = "RECAL_LAUNCHER_PID"

// orphanWatch ends a rank whose launcher is gone (a second SIGINT, or the
// launcher killed): its peers are going too, and nothing would wait for it.
func orphanWatch() {
	pid, err := strconv.Atoi(os.Getenv(launcherEnv))
	if err != nil {
		return
	}
	go func() {
		for range time.Tick(time.Second) {
			if os.Getppid() != pid {
				fmt.Fprintf(os.Stderr, "recal: the launcher (pid %d) is gone; this rank stops\n", pid)
				os.Exit(1)
			}
		}
	}()
}

// exitStatus is a rank's exit code (1 when killed by a signal) and how it
// ended, in words.
func exitStatus(err error) (int, string) {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return 1, "failed: " + err.Error()
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 1, "was killed by signal " + ws.Signal().String()
	}
	return ee.ExitCode(), "exited with status " + strconv.Itoa(ee.ExitCode())
}

// withoutFlag removes --name and its value (--name V, --name=V, one dash
// or two) from args.
func withoutFlag(args []string, name string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		bare := strings.TrimLeft(a, "-")
		if len(a)-len(bare) == 0 || len(a)-len(bare) > 2 {
			out = append(out, a)
			continue
		}
		if bare == name {
			i++ // its value
			continue
		}
		if strings.HasPrefix(bare, name+"=") {
			continue
		}
		out = append(out, a)
	}
	return out
}
