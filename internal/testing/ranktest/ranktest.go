// Package ranktest starts the ranks of a data-parallel test job on
// loopback: copies of the running test binary, each running one helper
// test of the calling package with torchrun's variables (RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) set, as torchrun
// would start them on one node.
package ranktest

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// FreePort returns a TCP port on loopback that nothing listens on.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Launch starts world ranks running the test named helper (one that does a
// rank's work and skips when its own variables are unset), with the store
// of rank 0 at port on loopback and env added to every rank's environment.
// It returns their commands, started, and their combined outputs.
func Launch(t testing.TB, ctx context.Context, helper string, world, port int, env ...string) ([]*exec.Cmd, []*bytes.Buffer) {
	t.Helper()
	var cmds []*exec.Cmd
	var outs []*bytes.Buffer
	for r := 0; r < world; r++ {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+helper+"$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(world),
			"LOCAL_RANK="+strconv.Itoa(r), "LOCAL_WORLD_SIZE="+strconv.Itoa(world),
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port))
		cmd.Env = append(cmd.Env, env...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
		outs = append(outs, &out)
	}
	return cmds, outs
}
