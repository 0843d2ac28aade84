package eval_test

import (
	"os"
	"testing"

	"github.com/recal-project/recal/torchbridge"
)

func TestMain(m *testing.M) {
	torchbridge.UseCPURuntimeEnv() // see its doc: no spinning OpenMP threads, no mmap churn
	os.Exit(m.Run())
}
