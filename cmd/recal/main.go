// Command recal trains, evaluates and runs reinforcement-learning LLM
// routers (the ReCal method). Run `recal --help` for the commands.
//
// Exit status: 0 on success, 1 on any error (the message goes to stderr),
// 2 on a usage or configuration error, 130 when training was interrupted
// (after saving a checkpoint) or on a second SIGINT/SIGTERM, which exits at
// once. recal never prompts.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/urfave/cli/v3"

	"github.com/recal-project/recal/torchbridge"
)

func main() {
	torchbridge.UseFastBLAS() // first: it re-executes recal with UsePassiveOpenMP's variables too
	torchbridge.UsePassiveOpenMP()
	ctx, stop := interruptContext(context.Background(), os.Stderr, os.Exit)
	defer stop()
	os.Exit(run(ctx, os.Args))
}

// interruptContext returns a context cancelled by the first SIGINT or
// SIGTERM, on which commands stop cleanly (train finishes its step and saves
// a checkpoint). A second signal calls exit(130) at once: checkpoints are
// written so that a stop at any instant leaves checkpoints/last loadable.
// stop ends the handling.
func interruptContext(parent context.Context, stderr io.Writer, exit func(int)) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sig:
			fmt.Fprintf(stderr, "recal: %v: stopping cleanly; send it again to exit at once\n", s)
			cancel()
		case <-done:
			return
		}
		select {
		case s := <-sig:
			fmt.Fprintf(stderr, "recal: %v again: exiting at once\n", s)
			exit(130)
		case <-done:
		}
	}()
	var once sync.Once
	return ctx, func() {
		once.Do(func() {
			signal.Stop(sig)
			close(done)
			cancel()
		})
	}
}

// usageError marks errors in how recal was called.
type usageError struct{ error }

// requireFlags returns a usage error naming the first flag not given.
func requireFlags(cmd *cli.Command, names ...string) error {
	for _, n := range names {
		if !cmd.IsSet(n) {
			return usageError{fmt.Errorf("%s: flag --%s is required", cmd.FullName(), n)}
		}
	}
	return nil
}

// newApp builds recal's command tree: every command, its flags and help.
// docs/cli.md is generated from it.
func newApp() *cli.Command {
	app := &cli.Command{
		Name:  "recal",
		Usage: "train and evaluate reinforcement-learning LLM routers with calibrated rewards (ReCal)",
		Description: "recal trains a small policy LLM to route each question over a pool of models\n" +
			"(<search>MODEL: sub-query</search> ... <answer>...</answer>) with GRPO and ReCal's\n" +
			"calibrated learning signal. The policy runs in libtorch; see the README.",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "threads", Usage: "CPU threads for libtorch (0 = all cores)"},
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error"},
		},
		Before: func(ctx context.Context, cmd *cli.Command) (context.Context, error) {
			var lvl slog.Level
			if err := lvl.UnmarshalText([]byte(cmd.String("log-level"))); err != nil {
				return ctx, usageError{fmt.Errorf("--log-level: %w", err)}
			}
			slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl})))
			return ctx, nil
		},
		Commands: []*cli.Command{trainCommand(), evalCommand(), ablateCommand(), plotCommand(), generateCommand(), policyCommand(), serveCommand(), sftDirectCommand(), collectCommand(), fitCommand(), table1Command(), frontierCommand(), outcomesCommand()},
		OnUsageError: func(ctx context.Context, cmd *cli.Command, err error, isSubcommand bool) error {
			return usageError{err}
		},
		ExitErrHandler: func(context.Context, *cli.Command, error) {},
	}
	keepCommas(app)
	return app
}

// keepCommas makes every repeatable flag of cmd and its subcommands take
// each value whole: urfave/cli splits them at commas by default, which cut
// a TOML list given to --set (sft.chain=["fid","gpt4"]) and a --stop
// string holding a comma.
func keepCommas(cmd *cli.Command) {
	cmd.DisableSliceFlagSeparator = true
	for _, sub := range cmd.Commands {
		keepCommas(sub)
	}
}

func run(ctx context.Context, args []string) int {
	app := newApp()
	argv = args // the ranks of --nproc run the same command line
	err := app.Run(ctx, args)
	if err == nil {
		return 0
	}
	fmt.Fprintln(os.Stderr, "recal:", err)
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	var ee exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return 1
}
