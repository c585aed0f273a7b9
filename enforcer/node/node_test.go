package node_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/enforcer/node"
	"github.com/sluicehq/sluice/internal/testenv"
)

func TestNewRefusesAnIncompleteConfig(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  node.Config
		want string
	}{
		{"no console", node.Config{RedisURL: "redis://127.0.0.1:9/0"}, "console url is required"},
		{"no redis", node.Config{ConsoleURL: "http://127.0.0.1:9"}, "redis url is required"},
		{"bad console", node.Config{ConsoleURL: "ftp://x", RedisURL: "redis://127.0.0.1:9/0"}, "console"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n, err := node.New(tt.cfg)
			if err == nil {
				n.Close()
				t.Fatal("New accepted the config")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q, want it to mention %q", err, tt.want)
			}
		})
	}
}

// A node with a Registry reports its metrics there, the console gauge
// included; without one it has none. Nothing is dialled.
func TestNewMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	n, err := node.New(node.Config{ConsoleURL: "http://127.0.0.1:9", RedisURL: testenv.RedisURL(t), NodeID: "n1", Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if n.ID() != "n1" || n.Engine == nil || n.Subscriber == nil || n.Metrics == nil {
		t.Fatalf("node incomplete: id %q, engine %v, subscriber %v, metrics %v", n.ID(), n.Engine != nil, n.Subscriber != nil, n.Metrics != nil)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range families {
		names = append(names, f.GetName())
	}
	if !strings.Contains(strings.Join(names, " "), "sluice_enforcer_console_connected") {
		t.Errorf("metrics %v lack sluice_enforcer_console_connected", names)
	}

	bare, err := node.New(node.Config{ConsoleURL: "http://127.0.0.1:9", RedisURL: testenv.RedisURL(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	if bare.Metrics != nil || bare.ID() == "" {
		t.Errorf("without a registry: metrics %v, id %q; want none and the hostname", bare.Metrics, bare.ID())
	}
}
