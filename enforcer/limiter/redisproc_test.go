package limiter

import (
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testenv"
)

// startCluster starts a Redis Cluster of three masters (no replicas) on free
// ports and returns the seed list. It takes about a second.
func startCluster(t testing.TB) string {
	t.Helper()
	return testenv.StartCluster(t, 3, 0, 2*time.Second).Seeds()
}

// TestMain keeps go-redis's own logging (a line per failed dial, which the
// dead- and restarted-Redis tests cause by the thousand) out of test output.
func TestMain(m *testing.M) {
	SetLogger(slog.New(slog.DiscardHandler))
	os.Exit(m.Run())
}
