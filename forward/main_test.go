package forward

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(federateChildEnv); spec != "" {
		os.Exit(serveFederateChild(spec)) // BenchmarkCycle's fake Prometheus
	}
	goleak.VerifyTestMain(m)
}
