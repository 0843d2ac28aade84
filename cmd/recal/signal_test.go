package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestInterruptHelper is not a test: TestInterrupts runs the test binary
// with RECAL_INTERRUPT_HELPER=1 to get a process that handles signals as
// recal does. It reports "cancelled" when the first signal cancelled the
// context, then pretends to write a checkpoint until stdin says "finish"
// (exit 0) or a signal makes it exit.
func TestInterruptHelper(t *testing.T) {
	if os.Getenv("RECAL_INTERRUPT_HELPER") != "1" {
		t.Skip("run by TestInterrupts")
	}
	ctx, stop := interruptContext(context.Background(), os.Stderr, os.Exit)
	defer stop()
	fmt.Println("ready")
	<-ctx.Done()
	fmt.Println("cancelled")
	line, _ := bufio.NewReader(os.Stdin).ReadString('\n')
	if strings.TrimSpace(line) == "finish" {
		os.Exit(0)
	}
	os.Exit(3)
}

// The first SIGINT/SIGTERM only cancels the context (training saves a
// checkpoint and exits 130 itself); a second one exits at once with status
// 130, without waiting for the checkpoint.
func TestInterrupts(t *testing.T) {
	cases := []struct {
		name    string
		signals []syscall.Signal
		code    int
	}{
		{"one SIGINT lets the command finish", []syscall.Signal{syscall.SIGINT}, 0},
		{"a second SIGINT exits at once", []syscall.Signal{syscall.SIGINT, syscall.SIGINT}, 130},
		{"SIGTERM then SIGINT exits at once", []syscall.Signal{syscall.SIGTERM, syscall.SIGINT}, 130},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestInterruptHelper$")
			cmd.Env = append(os.Environ(), "RECAL_INTERRUPT_HELPER=1")
			stdin, _ := cmd.StdinPipe()
			out, _ := cmd.StdoutPipe()
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			lines := bufio.NewScanner(out)
			expect := func(want string) {
				t.Helper()
				if !lines.Scan() || lines.Text() != want {
					t.Fatalf("helper said %q, want %q; stderr: %s", lines.Text(), want, stderr.String())
				}
			}
			expect("ready")
			for i, s := range c.signals {
				if err := cmd.Process.Signal(s); err != nil {
					t.Fatal(err)
				}
				if i == 0 {
					expect("cancelled") // the first signal cancels, and the process lives on
				}
			}
			if len(c.signals) == 1 {
				io.WriteString(stdin, "finish\n")
			}
			done := make(chan error, 1)
			go func() { io.Copy(io.Discard, out); done <- cmd.Wait() }()
			var err error
			select {
			case err = <-done:
			case <-time.After(20 * time.Second):
				t.Fatalf("the helper did not exit 20 s after the signals %v: a second signal was swallowed", c.signals)
			}
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != c.code {
				t.Errorf("exit status %d after %v, want %d; stderr: %s", code, c.signals, c.code, stderr.String())
			}
		})
	}
}
