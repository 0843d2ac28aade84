package table1

import (
	"io"
	"log/slog"
	"os"
	"testing"

	"github.com/recal-project/recal/torchbridge"
)

func TestMain(m *testing.M) {
	torchbridge.UsePassiveOpenMP() // see its doc: idle OpenMP threads must not spin
	os.Exit(m.Run())
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
