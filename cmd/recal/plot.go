package main

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/urfave/cli/v3"

	"github.com/recal-project/recal/internal/plot"
)

func plotCommand() *cli.Command {
	return &cli.Command{
		Name:      "plot",
		Usage:     "draw a run's curves (rewards, calls, model shares, entropy, validation F1) as PNG and SVG",
		ArgsUsage: "RUN_DIR",
		Flags:     []cli.Flag{&cli.StringFlag{Name: "out", Usage: "output folder (default RUN_DIR/plots)"}},
		Action: func(ctx context.Context, cmd *cli.Command) error {
			if cmd.Args().Len() != 1 {
				return usageError{fmt.Errorf("plot: want one RUN_DIR argument")}
			}
			dir := cmd.Args().First()
			out := cmd.String("out")
			if out == "" {
				out = filepath.Join(dir, "plots")
			}
			files, err := plot.Render(dir, out)
			if err != nil {
				return err
			}
			for _, f := range files {
				fmt.Println(f)
			}
			return nil
		},
	}
}
