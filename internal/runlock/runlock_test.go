package runlock

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// holdEnv makes the test binary a process that holds the lock of a folder
// (TestHolder) until it is killed.
const holdEnv = "RUNLOCK_TEST_HOLD"

// TestHolder is not a test: it is the process TestLockAcrossProcesses
// starts to hold a lock.
func TestHolder(t *testing.T) {
	dir := os.Getenv(holdEnv)
	if dir == "" {
		t.Skip("run by TestLockAcrossProcesses")
	}
	if _, err := Acquire(dir, "test holder"); err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println("held")
	time.Sleep(time.Minute) // killed before
	os.Exit(1)
}

// hold starts a process holding dir's lock and returns it once it holds it.
func hold(t *testing.T, dir string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHolder$", "-test.count=1")
	cmd.Env = append(os.Environ(), holdEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "held" {
		t.Fatalf("the holder process said %q (%v), want \"held\"", line, err)
	}
	return cmd
}

// A folder locked by a live process is refused with an error naming that
// process; once the process is killed (SIGKILL: no clean release, its lock
// file stays) the lock is stale and taken over.
func TestLockAcrossProcesses(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	holder := hold(t, dir)
	_, err := Acquire(dir, "recal train")
	var he *HeldError
	if !errors.As(err, &he) || he.Holder.PID != holder.Process.Pid {
		t.Fatalf("Acquire on a folder held by pid %d: %v; want a HeldError naming that pid", holder.Process.Pid, err)
	}
	for _, want := range []string{dir, "in use by pid " + strconv.Itoa(holder.Process.Pid), "test holder"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q: the user must learn which process holds the folder", err, want)
		}
	}

	holder.Process.Signal(syscall.SIGKILL)
	holder.Wait()
	if _, err := os.Stat(filepath.Join(dir, File)); err != nil {
		t.Fatalf("the killed holder's lock file is gone (%v): the test no longer covers a stale lock", err)
	}
	l, err := Acquire(dir, "recal train")
	if err != nil {
		t.Fatalf("Acquire after the holder died: %v; want the stale lock taken over", err)
	}
	defer l.Release()
	var h Holder
	b, _ := os.ReadFile(filepath.Join(dir, File))
	if err := json.Unmarshal(b, &h); err != nil || h.PID != os.Getpid() || h.Command != "recal train" {
		t.Errorf("lock file after the takeover: %q (%v), want this process (pid %d, recal train)", b, err, os.Getpid())
	}
}

// Within one process, too, a second Acquire is refused while the first
// holds the lock; Release removes the lock file (and the folder, when
// Acquire made it and nothing else was written), and is safe to call twice.
func TestLockInProcess(t *testing.T) {
	t.Run("held, then released", func(t *testing.T) {
		top := filepath.Join(t.TempDir(), "runs")
		dir := filepath.Join(top, "run")
		l, err := Acquire(dir, "recal ablate")
		if err != nil {
			t.Fatal(err)
		}
		_, err = Acquire(dir, "recal ablate")
		if !strings.Contains(fmt.Sprint(err), "in use by pid "+strconv.Itoa(os.Getpid())) {
			t.Fatalf("second Acquire: %v; want a refusal naming this process's pid", err)
		}
		if err := l.Release(); err != nil {
			t.Fatal(err)
		}
		if err := l.Release(); err != nil {
			t.Fatalf("second Release: %v, want nil", err)
		}
		if _, err := os.Stat(top); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the folders Acquire made are still there after Release (%v), want them removed: nothing was written in them", err)
		}
		l2, err := Acquire(dir, "recal train")
		if err != nil {
			t.Fatalf("Acquire after Release: %v", err)
		}
		l2.Release()
	})
	t.Run("a folder with work in it is kept", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "run")
		l, err := Acquire(dir, "recal train")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "metrics.jsonl"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		l.Release()
		entries, err := os.ReadDir(dir)
		if err != nil || len(entries) != 1 || entries[0].Name() != "metrics.jsonl" {
			t.Errorf("after Release the folder holds %v (%v), want metrics.jsonl alone (the lock file removed, the work kept)", entries, err)
		}
	})
	t.Run("a lock file left without a lock is taken over", func(t *testing.T) {
		dir := t.TempDir()
		stale, _ := json.Marshal(Holder{PID: 1 << 30, Host: "gone", Command: "recal train"})
		if err := os.WriteFile(filepath.Join(dir, File), stale, 0o644); err != nil {
			t.Fatal(err)
		}
		l, err := Acquire(dir, "recal train")
		if err != nil {
			t.Fatalf("Acquire over a lock file nobody holds: %v; want it taken over", err)
		}
		l.Release()
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("Release removed a folder Acquire did not make: %v", err)
		}
	})
}

// A run folder that is a symbolic link to nothing is named as such, not
// reported as "mkdir …: file exists".
func TestAcquireDanglingLink(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.Symlink(filepath.Join(t.TempDir(), "gone"), dir); err != nil {
		t.Fatal(err)
	}
	l, err := Acquire(dir, "test")
	if err == nil {
		l.Release()
		t.Fatal("Acquire through a dangling link succeeded; want an error")
	}
	if !strings.Contains(err.Error(), dir+" is a symbolic link to ") || !strings.Contains(err.Error(), "which does not exist") {
		t.Fatalf("error %q; want it to name the dangling link", err)
	}
}
