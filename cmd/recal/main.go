// Command recal trains, evaluates and runs reinforcement-learning LLM
// routers (the ReCal method). Run `recal --help` for the commands.
//
// Exit status: 0 on success, 1 on any error (the message goes to stderr),
// 2 on a usage or configuration error, 130 when training was interrupted
// (after saving a checkpoint). recal never prompts.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v3"

	"github.com/recal-project/recal/torchbridge"
)

func main() {
	torchbridge.UsePassiveOpenMP()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args))
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

func run(ctx context.Context, args []string) int {
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
		Commands: []*cli.Command{trainCommand(), evalCommand(), ablateCommand(), plotCommand(), generateCommand(), policyCommand()},
		OnUsageError: func(ctx context.Context, cmd *cli.Command, err error, isSubcommand bool) error {
			return usageError{err}
		},
		ExitErrHandler: func(context.Context, *cli.Command, error) {},
	}
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
