package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Toxiproxy is a Shopify toxiproxy proxy run in the test's process: a TCP
// proxy on a free loopback port in front of upstream, whose traffic the
// test degrades with toxics (latency, reset_peer, bandwidth, timeout, ...;
// see https://github.com/Shopify/toxiproxy#toxics). It stops when the test
// ends.
type Toxiproxy struct {
	t     testing.TB
	proxy *toxiproxy.Proxy
}

// StartToxiproxy starts a proxy to upstream (host:port).
func StartToxiproxy(t testing.TB, upstream string) *Toxiproxy {
	t.Helper()
	// Toxics log through loggers of their own, some at trace level for
	// every chunk they pass; nothing else in a test binary uses zerolog.
	zerolog.SetGlobalLevel(zerolog.Disabled)
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(server, t.Name(), "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("start toxiproxy to %s: %v", upstream, err)
	}
	t.Cleanup(p.Stop)
	return &Toxiproxy{t: t, proxy: p}
}

// Addr is the proxy's host:port: connect there instead of to upstream.
func (x *Toxiproxy) Addr() string { return x.proxy.Listen }

// AddToxic adds a toxic named name of type typ on stream ("downstream":
// upstream to client, "upstream": client to upstream) to every connection,
// open or new, with its attributes (e.g. {"latency": 100} for a latency
// toxic, in ms).
func (x *Toxiproxy) AddToxic(name, typ, stream string, attrs map[string]any) {
	x.t.Helper()
	body, err := json.Marshal(map[string]any{"name": name, "type": typ, "stream": stream, "toxicity": 1.0, "attributes": attrs})
	if err != nil {
		x.t.Fatal(err)
	}
	if _, err := x.proxy.Toxics.AddToxicJson(bytes.NewReader(body)); err != nil {
		x.t.Fatalf("add toxic %s: %v", name, err)
	}
}

// RemoveToxic removes the toxic named name.
func (x *Toxiproxy) RemoveToxic(name string) {
	x.t.Helper()
	if err := x.proxy.Toxics.RemoveToxic(context.Background(), name); err != nil {
		x.t.Fatalf("remove toxic %s: %v", name, err)
	}
}
