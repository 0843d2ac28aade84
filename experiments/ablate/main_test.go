package ablate

import (
	"os"
	"testing"

	"github.com/recal-project/recal/torchbridge"
)

func TestMain(m *testing.M) {
	torchbridge.UsePassiveOpenMP() // see its doc: idle OpenMP threads must not spin
	os.Exit(m.Run())
}
