package sftdirect_test

import (
	"os"
	"testing"

	"github.com/recal-project/recal/config"
	"github.com/recal-project/recal/internal/testing/testenv"
	"github.com/recal-project/recal/internal/testing/testpolicy"
	"github.com/recal-project/recal/torchbridge"
)

func TestMain(m *testing.M) {
	torchbridge.UsePassiveOpenMP() // see its doc: idle OpenMP threads must not spin
	os.Exit(m.Run())
}

func microCheckpoint(t *testing.T) string { return testpolicy.Micro(t, "../..", 1) }

// testConfig is recal.toml made small for tests (testenv.Config).
func testConfig(t *testing.T, ck string, sets ...string) config.Config {
	return testenv.Config(t, "../..", ck, sets...)
}

func readJSONL(t *testing.T, path string) []map[string]any { return testenv.ReadJSONL(t, path) }
