package serve

import (
	"context"
	"errors"
	"fmt"
	"net"
)

// Run serves HTTP on ln (Serve) while decode, the backend's decode loop,
// runs: the decode loop runs until the HTTP side has drained, and if it
// stops on its own (a libtorch error) the server stops too. ready is
// called once the server reports ready, before it serves.
func (s *Server) Run(ctx context.Context, ln net.Listener, decode func(context.Context) error, ready func()) error {
	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	runDone := make(chan error, 1)
	go func() { runDone <- decode(runCtx) }()
	serveCtx, stopServe := context.WithCancel(ctx)
	defer stopServe()
	var runErr error
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		select {
		case runErr = <-runDone:
			if runErr == nil {
				runErr = errors.New("the decode loop stopped")
			}
			s.SetReady(false)
			stopServe()
		case <-serveCtx.Done():
		}
	}()
	s.SetReady(true)
	ready()
	err := s.Serve(serveCtx, ln)
	stopServe()
	<-ran
	stopRun()
	if runErr == nil {
		runErr = <-runDone
	}
	switch {
	case err != nil:
		return err
	case runErr != nil && !errors.Is(runErr, context.Canceled):
		return fmt.Errorf("serve: %w", runErr)
	}
	return nil
}
