package procgroup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
	"time"
)

// Local launch: `recal --nproc N` starts N ranks of its own command line on
// this machine, as `torchrun --standalone --nproc-per-node N` would, with
// the variables ParseEnv reads.

// LauncherEnv holds the pid of the recal --nproc that started a rank.
const LauncherEnv = "RECAL_LAUNCHER_PID"

// ExitError is a local job's merged exit status, for the launcher to exit
// with.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// RunLocal runs n ranks of exe args on this machine, rendezvousing at the
// store the caller serves on 127.0.0.1:port, and merges their exit
// statuses: nil when every rank succeeded, an *ExitError of 130 when every
// rank that failed was interrupted, else of the status of the first rank
// that failed (1 for a rank killed by a signal). A first SIGINT or SIGTERM
// (ctx cancelled) is passed on to every rank, which finish their step and
// save a checkpoint; the ranks die with the launcher (a second signal exits
// it at once). When a rank fails the others stop by themselves within
// timeout (dist.timeout); any still running a minute after that are
// killed.
func RunLocal(ctx context.Context, n int, exe string, args []string, port int, timeout time.Duration) error {

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
				LauncherEnv+"="+strconv.Itoa(os.Getpid()))
			c.Stdin, c.Stdout, c.Stderr = nil, os.Stdout, os.Stderr
			// Their own process group: a terminal's Ctrl-C reaches the
			// launcher alone, which passes it on once. Killed with the
			// launcher, so no rank outlives it (a rank that re-executes
			// itself from another thread loses that signal: WatchLauncher
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
		return &ExitError{Code: 130, Err: fmt.Errorf("interrupted: every rank stopped cleanly; rerun with --resume to continue")}
	}
	code, how := exitStatus(first.err)
	return &ExitError{Code: code, Err: fmt.Errorf("rank %d of %d %s first", first.rank, n, how)}
}

// WatchLauncher ends a rank whose launcher is gone (a second SIGINT, or the
// launcher killed): its peers are going too, and nothing would wait for it.
func WatchLauncher() {
	pid, err := strconv.Atoi(os.Getenv(LauncherEnv))
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
