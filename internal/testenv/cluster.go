package testenv

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Cluster is a Redis Cluster of the test's own: masters and their replicas,
// each a RedisServer on free loopback ports, killed when the test ends.
type Cluster struct {
	t testing.TB
	// Nodes are every node, masters first as redis-cli assigned them at
	// creation (a failover changes who is master: see Masters).
	Nodes []*RedisServer
}

// StartCluster starts a Redis Cluster of masters masters with replicas
// replicas each, waits until every node sees it whole and ok, and returns
// it. Three masters without replicas take about a second. nodeTimeout is
// the cluster-node-timeout: how long a master must be unreachable before
// its replica takes over (plus about a second of election).
func StartCluster(t testing.TB, masters, replicas int, nodeTimeout time.Duration) *Cluster {
	t.Helper()
	NeedCommands(t, "redis-server", "redis-cli")
	c := &Cluster{t: t}
	var addrs []string
	for range masters * (1 + replicas) {
		// The cluster bus port is set explicitly (Redis 7), so both are free.
		n := StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(FreePort(t)), "--cluster-node-timeout", strconv.FormatInt(nodeTimeout.Milliseconds(), 10))
		c.Nodes = append(c.Nodes, n)
		addrs = append(addrs, n.Addr())
	}
	args := append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	c.WaitOK(15 * time.Second)
	return c
}

// Seeds is the comma-separated host:port list of every node.
func (c *Cluster) Seeds() string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr()
	}
	return strings.Join(addrs, ",")
}

// WaitOK waits until every running node reports cluster_state:ok and knows
// every node, and, for a replica, is in sync with its master.
func (c *Cluster) WaitOK(timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	want := "cluster_known_nodes:" + strconv.Itoa(len(c.Nodes))
	for _, n := range c.Nodes {
		if !n.Running() {
			continue
		}
		for {
			info := n.CLI("cluster", "info")
			repl := n.CLI("info", "replication")
			synced := !strings.Contains(repl, "role:slave") || strings.Contains(repl, "master_link_status:up")
			if strings.Contains(info, "cluster_state:ok") && strings.Contains(info, want) && synced {
				break
			}
			if time.Now().After(deadline) {
				c.t.Fatalf("cluster node %s not ok after %v:\n%s\n%s", n.Addr(), timeout, info, repl)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// Masters returns the running nodes that are masters now.
func (c *Cluster) Masters() []*RedisServer {
	var ms []*RedisServer
	for _, n := range c.Nodes {
		if n.Running() && strings.Contains(n.CLI("info", "replication"), "role:master") {
			ms = append(ms, n)
		}
	}
	return ms
}

// MasterOf returns the running master that serves slot now.
func (c *Cluster) MasterOf(slot int) *RedisServer {
	c.t.Helper()
	for _, n := range c.Masters() {
		// CLUSTER COUNTKEYSINSLOT answers on any node; a master owns the slot
		// when CLUSTER NODES marks "myself,master" with the slot in range.
		for line := range strings.SplitSeq(n.CLI("cluster", "nodes"), "\n") {
			f := strings.Fields(line)
			if len(f) < 9 || !strings.Contains(f[2], "myself") || !strings.Contains(f[2], "master") {
				continue
			}
			for _, r := range f[8:] {
				lo, hi, ok := strings.Cut(r, "-")
				if !ok {
					hi = lo
				}
				l, err1 := strconv.Atoi(lo)
				h, err2 := strconv.Atoi(hi)
				if err1 == nil && err2 == nil && l <= slot && slot <= h {
					return n
				}
			}
		}
	}
	c.t.Fatalf("no running master serves slot %d", slot)
	return nil
}
