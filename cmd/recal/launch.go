package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/internal/procgroup"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/torchbridge"
	"github.com/recal-project/recal/trainer"
)

// Several ranks. A command that runs data-parallel (train, eval) is one
// rank of a job when a launcher set torchrun's or Slurm's variables (see
// procgroup.ParseEnv); with --nproc N it is the launcher itself: it starts N
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
func rankLaunch(cmd *cli.Command) (procgroup.Launch, error) {
	l, err := procgroup.FromEnv()
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
func joinRanks(ctx context.Context, l procgroup.Launch, cmd *cli.Command, timeout time.Duration, join func() (procgroup.Group, error)) (procgroup.Group, error) {
	if !l.Distributed() {
		return nil, nil
	}
	procgroup.WatchLauncher()
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
	if os.Getenv(procgroup.LauncherEnv) != "" {
		launcher = "recal --nproc"
	}
	slog.Info("data-parallel job", "ranks", l.WorldSize, "launcher", launcher, "rendezvous", net.JoinHostPort(l.MasterAddr, strconv.Itoa(l.MasterPort)), "timeout", timeout.String())
	return g, nil
}

// joinEvalRanks places an evaluation's rank: its own GPU (policy.device =
// "cuda") and its share of the pool's global limits, written into cfg; then
// it joins the job's process group (nil for one process).
func joinEvalRanks(ctx context.Context, cmd *cli.Command, cfg *config.Config, launch procgroup.Launch) (procgroup.Group, error) {
	var err error
	if cfg.Policy.Device, err = trainer.RankDevice(cfg.Policy.Device, launch); err != nil {
		return nil, usageError{err}
	}
	cfg.Pool = trainer.SharePool(cfg.Pool, launch.Rank, launch.WorldSize, slog.Default())
	return joinRanks(ctx, launch, cmd, cfg.Dist.Timeout, func() (procgroup.Group, error) {
		return trainer.JoinGroup(ctx, launch, cfg.Dist, cfg.Policy.Device)
	})
}

// rankThreads sets libtorch's CPU threads of a rank: --threads, else
// policy.threads, else this machine's cores split between its ranks
// (LOCAL_WORLD_SIZE; under Slurm each task sees only its own cores).
func rankThreads(cmd *cli.Command, configured int, l procgroup.Launch) error {
	if cmd.Root().IsSet("threads") {
		configured = int(cmd.Root().Int("threads"))
	}
	if l.Distributed() {
		configured = trainer.Threads(configured, trainer.LocalWorldSize())
	}
	if l.Rank == 0 {
		logBLAS()
	}
	return rollout.SetThreads(configured)
}

// launchLocal runs n ranks of this command line (less --nproc) on this
// machine (procgroup.RunLocal) and exits with their merged status.
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
	err = procgroup.RunLocal(ctx, n, exe, args, port, timeout)
	if e, ok := errors.AsType[*procgroup.ExitError](err); ok {
		return exitError{code: e.Code, err: e.Err}
	}
	return err
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
