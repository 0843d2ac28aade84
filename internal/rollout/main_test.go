package rollout_test

import (
	"os"
	"testing"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/internal/testing/testenv"
	"github.com/recal-project/recal/torchbridge"
)

func TestMain(m *testing.M) {
	torchbridge.UsePassiveOpenMP() // see its doc: idle OpenMP threads must not spin
	os.Exit(m.Run())
}

// testConfig is recal.toml made small for tests (testenv.Config).
func testConfig(t *testing.T, ck string, sets ...string) config.Config {
	return testenv.Config(t, "../..", ck, sets...)
}
