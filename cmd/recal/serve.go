package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v3"

	pf "github.com/recal-project/recal/cmd/recal/internal/preflight"
	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/internal/rollout"
	"github.com/recal-project/recal/serve"
	"github.com/recal-project/recal/torchbridge"
)

func serveCommand() *cli.Command {
	return &cli.Command{
		Name:  "serve",
		Usage: "answer questions over HTTP with a policy checkpoint, in OpenAI's chat completions format",
		Description: "Loads the policy, builds the pool and serves POST /v1/chat/completions (plain and\n" +
			"streamed), GET /v1/models, /healthz, /readyz and /metrics until SIGINT/SIGTERM, which stop\n" +
			"accepting, let the requests in flight finish within serve.drain_timeout and exit 0.\n" +
			"Settings: the [serve] table. Prints the API's base URL on stdout once ready; see\n" +
			"docs/serving.md for the request and response fields.",
		Flags: append(configFlags(),
			&cli.StringFlag{Name: "checkpoint", Usage: "policy checkpoint folder, or a training run folder for its checkpoints/best (else checkpoints/last) (required); the router's model id is recal-<the folder's name>"},
			&cli.StringFlag{Name: "addr", Usage: "host:port to listen on (default serve.addr; port 0 picks a free one)"},
			&cli.StringFlag{Name: "extra-models", Usage: "TOML file of [[models]] added to the pool (unseen models)"},
			&cli.StringFlag{Name: "trace", Usage: "append one JSON line per chat completion to this file (question, response, calls: rollouts.jsonl's shape)"},
			&cli.BoolFlag{Name: "dry-run", Usage: "check the config, checkpoint, pool, API keys and address, print a summary and exit (0, or 2 listing every problem); loads nothing"},
		),
		Action: runServe,
	}
}

// routerName is the model id clients ask for: recal-<checkpoint folder>.
func routerName(checkpoint string) string {
	return "recal-" + filepath.Base(filepath.Clean(checkpoint))
}

func runServe(ctx context.Context, cmd *cli.Command) error {
	if err := requireFlags(cmd, "checkpoint"); err != nil {
		return err
	}
	cfg, err := loadConfig(cmd)
	if err != nil {
		return err
	}
	if cmd.IsSet("addr") {
		cfg.Serve.Addr = cmd.String("addr")
		if err := cfg.Serve.Validate(); err != nil {
			return usageError{fmt.Errorf("--addr: %w", err)}
		}
	}
	if cfg, err = withExtraModels(cfg, cmd.String("extra-models")); err != nil {
		return err
	}
	// A run folder stands for its best checkpoint (train.keep_best), else
	// its last, as in recal eval; the router's id keeps the name given.
	name := routerName(cmd.String("checkpoint"))
	ck, which, err := rollout.ResolveCheckpoint(cmd.String("checkpoint"))
	if err != nil {
		return usageError{fmt.Errorf("--checkpoint: %w", err)}
	}
	if which != "" {
		slog.Info("serving the run's checkpoint", "picked", which, "checkpoint", ck)
	}
	if cmd.Bool("dry-run") {
		return dryRunUntil(ctx, func() error { return dryRunServe(os.Stdout, cfg, cmd.String("config"), ck, name, cmd.String("trace")) })
	}
	apiKey, err := cfg.Serve.APIKey()
	if err != nil {
		return usageError{err}
	}
	// The pool's API-key variables are read now, before the port is taken.
	if err := rollout.CheckPool(cfg.Pool); err != nil {
		return err
	}
	var trace io.Writer
	if p := cmd.String("trace"); p != "" {
		f, err := os.OpenFile(p, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		if err != nil {
			return fmt.Errorf("serve: --trace: %w", err)
		}
		defer f.Close()
		trace = f
	}
	// Listen before loading anything: a port in use fails now, not after
	// the policy is loaded, and nothing is served before it is.
	ln, err := net.Listen("tcp", cfg.Serve.Addr)
	if err != nil {
		return fmt.Errorf("serve: listen on %s: %w", cfg.Serve.Addr, err)
	}
	defer ln.Close()
	var metricsLn net.Listener
	if a := cfg.Serve.MetricsAddr; a != "" {
		if metricsLn, err = net.Listen("tcp", a); err != nil {
			return fmt.Errorf("serve: listen on serve.metrics_addr %s: %w", a, err)
		}
		defer metricsLn.Close()
	}
	if err := setThreadsFrom(cmd, decodingThreads(cfg.Policy)); err != nil {
		return err
	}
	env, closeAll, err := rollout.Open(cfg.Rollout(), ck, nil, slog.Default())
	if err != nil {
		return err
	}
	defer closeAll()
	svc, err := env.NewService(cfg.Serve.MaxBatch, cfg.Serve.MaxSamplings, uint64(cfg.Train.Seed))
	if err != nil {
		return err
	}
	srv, err := serve.New(serve.Options{Config: cfg.Serve, Name: name, Models: env.Pool.Models(), MaxTurns: cfg.Router.MaxTurns,
		APIKey: apiKey, MetricsListener: metricsLn, Backend: serviceBackend{svc}, Log: slog.Default(), Trace: trace})
	if err != nil {
		return err
	}

	url := "http://" + ln.Addr().String() + "/v1"
	err = srv.Run(ctx, ln, svc.Run, func() {
		attrs := []any{"url", url, "model", name, "pool", len(env.Pool.Models()), "max_batch", cfg.Serve.MaxBatch,
			"max_queue", cfg.Serve.MaxQueue, "auth", apiKey != ""}
		if metricsLn != nil {
			attrs = append(attrs, "metrics", "http://"+metricsLn.Addr().String()+"/metrics")
		}
		slog.Info("serving", attrs...)
		fmt.Println(url)
	})
	if err != nil {
		return err
	}
	slog.Info("stopped", "url", url)
	return nil
}

// dryRunServe is `recal serve --dry-run`: what runServe would load and use.
func dryRunServe(w io.Writer, cfg config.Config, configPath, checkpoint, name, trace string) error {
	p := pf.New("serve")
	p.Line("config       %s", configPath)
	pol, _ := p.Policy("--checkpoint", checkpoint)
	p.Line("device       %s, %s", cfg.Policy.Device, cfg.Policy.DType)
	p.Line("blas         %s", torchbridge.CurrentBLAS())
	p.Pool(cfg.Pool, cfg.Router) // before the plan: it sets the rows' response capacity
	dryRunMemory(p, cfg, pol.Config, pf.Job{World: 1, Rows: cfg.Serve.MaxBatch, RowsKey: "serve.max_batch"})
	s := cfg.Serve
	if _, err := s.APIKey(); err != nil {
		p.Problem("serve.api_key_env: %v", err)
	}
	if ln, err := net.Listen("tcp", s.Addr); err != nil {
		p.Problem("serve.addr: cannot listen on %s: %v", s.Addr, err)
	} else {
		ln.Close()
	}
	metrics := "on " + s.Addr
	if s.MetricsAddr != "" {
		metrics = "on " + s.MetricsAddr
		if ln, err := net.Listen("tcp", s.MetricsAddr); err != nil {
			p.Problem("serve.metrics_addr: cannot listen on %s: %v", s.MetricsAddr, err)
		} else {
			ln.Close()
		}
	}
	if s.APIKeyEnv != "" && !s.MetricsOpen {
		metrics += " with the token"
	}
	if trace != "" {
		p.Creatable("--trace", filepath.Dir(trace))
	}
	auth := "none"
	if s.APIKeyEnv != "" {
		auth = "bearer token from $" + s.APIKeyEnv
	}
	p.Line("serve        %s as %s: %d rows decoding, %d queued, timeout %s, drain %s, auth %s, /metrics %s",
		s.Addr, name, s.MaxBatch, s.MaxQueue, s.RequestTimeout, s.DrainTimeout, auth, metrics)
	return dryRunFinish(p, w)
}
