package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// SentinelGroup is a Redis master with one replica, monitored by three
// sentinels (quorum 2), all of the test's own on free loopback ports and
// killed when the test ends. Sentinels are `redis-server CONF --sentinel`:
// the Debian redis-server package has that mode built in, so no
// redis-sentinel package is needed.
type SentinelGroup struct {
	t testing.TB
	// Name is the master's name, as the sentinels monitor it.
	Name string
	// Master and Replica are the nodes as started; after a failover the
	// replica is the master (see MasterAddr).
	Master, Replica *RedisServer
	Sentinels       []*RedisServer
}

// StartSentinel starts a SentinelGroup and waits until the replica is in
// sync and every sentinel knows the replica and the other sentinels.
// downAfter is how long the master must be unreachable before the
// sentinels fail it over (plus about a second of election).
//
// Each sentinel's configuration names the replica and the other sentinels
// (with the ids they are given), as a sentinel's rewritten configuration
// does, so the group is ready at once rather than after the sentinels'
// hello messages (every 2 s) have introduced them to each other.
func StartSentinel(t testing.TB, downAfter time.Duration, masterArgs ...string) *SentinelGroup {
	t.Helper()
	NeedCommands(t, "redis-server", "redis-cli")
	g := &SentinelGroup{t: t, Name: "sluice"}
	g.Master = StartRedis(t, masterArgs...)
	g.Replica = StartRedis(t, "--replicaof", "127.0.0.1", strconv.Itoa(g.Master.port))
	for attempt := 0; ; attempt++ {
		err := g.startSentinels(downAfter)
		if err == nil {
			break
		}
		if attempt == 5 { // a port was taken in between, five times over
			t.Fatal(err)
		}
	}
	g.waitReady(15 * time.Second)
	return g
}

// startSentinels starts the group's three sentinels on free ports, each
// configured with the others; if one does not start, it stops those that
// did and returns why.
func (g *SentinelGroup) startSentinels(downAfter time.Duration) error {
	t := g.t
	t.Helper()
	const n = 3
	ports, ids := make([]int, n), make([]string, n)
	for i := range n {
		ports[i], ids[i] = FreePort(t), randomHex(20) // a sentinel id is 40 hex digits
	}
	var started []*RedisServer
	for i := range n {
		dir := t.TempDir()
		conf := filepath.Join(dir, "sentinel.conf")
		body := fmt.Sprintf("bind 127.0.0.1\ndir %s\nsentinel myid %s\nsentinel monitor %s 127.0.0.1 %d 2\n"+
			"sentinel down-after-milliseconds %s %d\nsentinel failover-timeout %s 5000\n"+
			"sentinel known-replica %s 127.0.0.1 %d\n",
			dir, ids[i], g.Name, g.Master.port, g.Name, downAfter.Milliseconds(), g.Name, g.Name, g.Replica.port)
		for j := range n {
			if j != i {
				body += fmt.Sprintf("sentinel known-sentinel %s 127.0.0.1 %d %s\n", g.Name, ports[j], ids[j])
			}
		}
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		s := &RedisServer{t: t, conf: conf, port: ports[i], args: []string{"--sentinel", "--loglevel", "warning"}}
		if err := s.launch(); err != nil {
			for _, s := range started {
				s.Stop()
			}
			return fmt.Errorf("start sentinel %d: %v\n%s", i, err, s.Log())
		}
		started = append(started, s)
	}
	for _, s := range started {
		t.Cleanup(s.Stop)
	}
	g.Sentinels = started
	return nil
}

// URL is the group's redis+sentinel:// URL (database 0).
func (g *SentinelGroup) URL() string {
	addrs := make([]string, len(g.Sentinels))
	for i, s := range g.Sentinels {
		addrs[i] = s.Addr()
	}
	return "redis+sentinel://" + strings.Join(addrs, ",") + "/" + g.Name
}

// MasterAddr is the master's host:port as the first running sentinel
// reports it.
func (g *SentinelGroup) MasterAddr() string {
	for _, s := range g.Sentinels {
		if s.Running() {
			f := strings.Fields(s.CLI("sentinel", "get-master-addr-by-name", g.Name))
			if len(f) == 2 {
				return f[0] + ":" + f[1]
			}
		}
	}
	return ""
}

// Failover asks a sentinel to fail the master over now (SENTINEL FAILOVER)
// and fails the test if it refuses.
func (g *SentinelGroup) Failover() {
	g.t.Helper()
	if out := g.Sentinels[0].CLI("sentinel", "failover", g.Name); !strings.Contains(out, "OK") {
		g.t.Fatalf("SENTINEL FAILOVER: %s", out)
	}
}

// WaitMaster waits until every sentinel reports addr as the master and addr
// serves as a master; it fails the test after timeout.
func (g *SentinelGroup) WaitMaster(addr string, timeout time.Duration) {
	g.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok := true
		for _, s := range g.Sentinels {
			f := strings.Fields(s.CLI("sentinel", "get-master-addr-by-name", g.Name))
			if len(f) != 2 || f[0]+":"+f[1] != addr {
				ok = false
			}
		}
		if ok {
			for _, n := range []*RedisServer{g.Master, g.Replica} {
				if n.Addr() == addr && !strings.Contains(n.CLI("info", "replication"), "role:master") {
					ok = false
				}
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("sentinels do not agree on master %s after %v", addr, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitReady waits until the replica is in sync (and counted good by a
// master with min-replicas-to-write) and each sentinel sees one replica
// and two other sentinels.
func (g *SentinelGroup) waitReady(timeout time.Duration) {
	g.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ready := strings.Contains(g.Replica.CLI("info", "replication"), "master_link_status:up")
		// A master with min-replicas-to-write refuses writes until it
		// counts its replica as good.
		if m := g.Master.CLI("info", "replication"); strings.Contains(m, "min_slaves_good_slaves:") && !strings.Contains(m, "min_slaves_good_slaves:1") {
			ready = false
		}
		for _, s := range g.Sentinels {
			m := fields(s.CLI("sentinel", "master", g.Name))
			if m["num-slaves"] != "1" || m["num-other-sentinels"] != "2" {
				ready = false
			}
		}
		if ready {
			return
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("sentinel group not ready after %v: replica %q, sentinel %q", timeout,
				g.Replica.CLI("info", "replication"), g.Sentinels[0].CLI("sentinel", "master", g.Name))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// fields reads redis-cli's output of a flat key/value reply (one per line).
func fields(out string) map[string]string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	m := make(map[string]string, len(lines)/2)
	for i := 0; i+1 < len(lines); i += 2 {
		m[strings.TrimSpace(lines[i])] = strings.TrimSpace(lines[i+1])
	}
	return m
}
