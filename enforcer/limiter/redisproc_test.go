package limiter

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testenv"
)

// startCluster starts a Redis Cluster of three masters (no replicas) on free
// ports and returns the seed list. It takes about a second.
func startCluster(t testing.TB) string {
	t.Helper()
	testenv.NeedCommands(t, "redis-server", "redis-cli")
	var nodes []*testenv.RedisServer
	var addrs []string
	for range 3 {
		// The cluster bus port is set explicitly (Redis 7), so both are free.
		p := testenv.StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(testenv.FreePort(t)), "--cluster-node-timeout", "2000")
		nodes = append(nodes, p)
		addrs = append(addrs, p.Addr())
	}
	out, err := exec.Command("redis-cli", append(append([]string{"--cluster", "create"}, addrs...), "--cluster-yes")...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	// Wait until every node sees the whole cluster as ok.
	deadline := time.Now().Add(15 * time.Second)
	for _, n := range nodes {
		c := redis.NewClient(&redis.Options{Addr: n.Addr()})
		for {
			info, err := c.ClusterInfo(context.Background()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:3") {
				break
			}
			if time.Now().After(deadline) {
				c.Close()
				t.Fatalf("cluster not ok after 15s: %q %v", info, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		c.Close()
	}
	return strings.Join(addrs, ",")
}

// TestMain keeps go-redis's own logging (a line per failed dial, which the
// dead- and restarted-Redis tests cause by the thousand) out of test output.
func TestMain(m *testing.M) {
	SetLogger(slog.New(slog.DiscardHandler))
	os.Exit(m.Run())
}
