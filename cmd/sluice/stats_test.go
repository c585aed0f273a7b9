package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/enforcer"
	"github.com/sluicehq/sluice/enforcer/node"
	"github.com/sluicehq/sluice/internal/consoletest"
	"github.com/sluicehq/sluice/internal/testenv"
)

// liveDomain's limits make every decision known in advance: per-user
// admits all, blocked, burst and shadowed (shadow mode) reject all without
// asking Redis.
const liveDomain = `domain: live
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000, name: per-user}
  - key: blocked
    rate_limit: {unit: second, requests_per_unit: 0, name: blocked}
  - key: burst
    rate_limit: {unit: second, requests_per_unit: 0, name: burst}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 0, name: shadowed}
`

// liveFleet is two console replicas on one database, one enforcer on each.
type liveFleet struct {
	consoles []string // base URLs
	nodes    []string // HTTP addresses; nodes[i] is connected to consoles[i]
	admin    *client  // signed in to consoles[0]
}

func startLiveFleet(t *testing.T, ctx context.Context, wg *sync.WaitGroup) *liveFleet {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dbURL, redisURL, prefix := testenv.PostgresURL(t), testenv.RedisURL(t), testenv.KeyPrefix(t)
	f := &liveFleet{}
	for range 2 {
		cfg := backend.Config{DatabaseURL: dbURL, AdminPassword: "live-password", SpikeWarmup: 3 * time.Second}
		f.consoles = append(f.consoles, consoletest.Start(t, ctx, wg, cfg, log))
	}
	f.admin = login(t, f.consoles[0], "admin", "live-password")
	// One node token per node: a token is bound to the node id it first connects with.
	toks := make([]struct {
		Token string `json:"token"`
	}, len(f.consoles))
	for i := range toks {
		f.admin.MustDo(t, "POST", "/api/v1/tokens", map[string]string{"name": fmt.Sprintf("live-%d", i), "role": "node"}, 201, &toks[i])
	}
	f.admin.MustDo(t, "PUT", "/api/v1/domains/live", map[string]any{"yaml": liveDomain, "message": "live", "base_version": 0}, 200, nil)
	for i, console := range f.consoles {
		ready := make(chan string, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := enforcer.Config{Config: node.Config{ConsoleURL: console, NodeToken: toks[i].Token, NodeID: fmt.Sprintf("live-%d", i), RedisURL: redisURL, StateDir: t.TempDir(), KeyPrefix: prefix},
				HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0"}
			err := enforcer.Run(ctx, cfg, log, func(a enforcer.Addrs) { ready <- a.HTTP.String() })
			if err != nil && ctx.Err() == nil {
				t.Errorf("enforcer %d: %v", i, err)
			}
		}()
		select {
		case n := <-ready:
			f.nodes = append(f.nodes, n)
		case <-time.After(10 * time.Second):
			t.Fatalf("enforcer %d did not start", i)
		}
	}
	// Both enforcers answer from the published rules.
	for _, n := range f.nodes {
		waitUntil(t, 10*time.Second, "an enforcer to load the rules", func() bool { return check(t, n, "user", "probe") == http.StatusOK })
	}
	return f
}

// check sends one check of key=value to an enforcer and returns the status.
func check(t *testing.T, node, key, value string) int {
	t.Helper()
	body := fmt.Sprintf(`{"domain":"live","descriptors":[{"entries":[{"key":%q,"value":%q}]}]}`, key, value)
	resp, err := http.Post("http://"+node+"/json", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func waitUntil(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type ruleTotals struct {
	Domain        string `json:"domain"`
	Rule          string `json:"rule"`
	Allowed       int64  `json:"allowed"`
	Limited       int64  `json:"limited"`
	ShadowLimited int64  `json:"shadow_limited"`
	StoreErrors   int64  `json:"store_errors"`
}

func totals(t *testing.T, c *client, from time.Time) map[string]ruleTotals {
	t.Helper()
	var out struct {
		Rules []ruleTotals `json:"rules"`
	}
	c.MustDo(t, "GET", "/api/v1/stats/totals?domain=live&from="+url.QueryEscape(from.UTC().Format(time.RFC3339)), nil, 200, &out)
	m := make(map[string]ruleTotals)
	for _, r := range out.Rules {
		m[r.Rule] = r
	}
	return m
}

// TestLiveTrafficFleetWide sends known traffic through two enforcers on two
// console replicas and checks that each replica answers for both: exact
// totals, the hot key, a publish marker, and exactly one spike (start and
// end) at a webhook for a step change, none for steady traffic.
func TestLiveTrafficFleetWide(t *testing.T) {
	// Not parallel: spikes are judged on paced traffic; other tests' load skews the rates.
	if testing.Short() {
		t.Skip("about 20 s of traffic")
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })

	var (
		hookMu sync.Mutex
		hooks  []map[string]any
	)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		json.NewDecoder(r.Body).Decode(&body)
		hookMu.Lock()
		hooks = append(hooks, body)
		hookMu.Unlock()
	}))
	t.Cleanup(hook.Close)

	f := startLiveFleet(t, ctx, &wg)
	f.admin.MustDo(t, "PUT", "/api/v1/alerts", map[string]any{
		"webhooks":       []map[string]any{{"url": hook.URL, "events": []string{"spike.start", "spike.end"}}},
		"spike_defaults": map[string]any{"floor_per_s": 5, "factor": 5, "for_s": 2},
	}, 200, nil)
	start := time.Now().Add(-2 * time.Second) // before the probes, which count too
	replicaB := login(t, f.consoles[1], "admin", "live-password")

	// Known traffic through both nodes.
	send := func(node, key, value string, n, want int) {
		t.Helper()
		for range n {
			if got := check(t, node, key, value); got != want {
				t.Fatalf("check %s=%s on %s = %d, want %d", key, value, node, got, want)
			}
		}
	}
	send(f.nodes[0], "user", "u1", 7, 200)
	send(f.nodes[1], "user", "u2", 5, 200)
	send(f.nodes[0], "blocked", "hot-key", 3, 429)
	send(f.nodes[1], "blocked", "hot-key", 1, 429)
	send(f.nodes[1], "blocked", "cold-key", 1, 429)
	send(f.nodes[0], "shadow", "s", 2, 200)
	send(f.nodes[1], "shadow", "s", 4, 200)
	want := map[string]ruleTotals{
		"per-user": {Domain: "live", Rule: "per-user", Allowed: 12 + 2}, // and one probe per node
		"blocked":  {Domain: "live", Rule: "blocked", Limited: 5},
		"shadowed": {Domain: "live", Rule: "shadowed", ShadowLimited: 6},
	}
	for i, c := range []*client{f.admin, replicaB} {
		var got map[string]ruleTotals
		deadline := time.Now().Add(5 * time.Second)
		for {
			got = totals(t, c, start)
			if fmt.Sprint(got) == fmt.Sprint(want) || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("replica %d totals = %+v, want %+v", i, got, want)
		}
	}

	// The hot key leads the live table, and a publish on one replica is
	// a marker on the other.
	f.admin.MustDo(t, "PUT", "/api/v1/domains/live", map[string]any{"yaml": liveDomain + "  - key: extra\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
		"message": "add extra", "base_version": 1}, 200, nil)
	type live struct {
		Rules []struct {
			Rule       string `json:"rule"`
			TopLimited []struct {
				Value string `json:"value"`
				Count int64  `json:"count"`
			} `json:"top_limited"`
		} `json:"rules"`
		Markers []struct {
			Version int64  `json:"version"`
			Message string `json:"message"`
			Kind    string `json:"kind"`
		} `json:"markers"`
	}
	var lv live
	replicaB.MustDo(t, "GET", "/api/v1/stats/live?domain=live", nil, 200, &lv)
	var top string
	for _, r := range lv.Rules {
		if r.Rule == "blocked" && len(r.TopLimited) > 0 {
			top = fmt.Sprintf("%s=%d", r.TopLimited[0].Value, r.TopLimited[0].Count)
		}
	}
	if top != "hot-key=4" {
		t.Errorf("top limited value of blocked = %q, want hot-key=4 (%+v)", top, lv.Rules)
	}
	if n := len(lv.Markers); n == 0 || lv.Markers[n-1].Message != "add extra" || lv.Markers[n-1].Kind != "publish" {
		t.Errorf("markers = %+v, want the publish \"add extra\" last", lv.Markers)
	}

	// Spikes: steady 429s on burst (its own baseline once warmed up), a
	// step to ten times that rate, and back.
	pace := func(rate, seconds int) {
		t.Helper()
		for s := range seconds {
			next := time.Now().Add(time.Second)
			send(f.nodes[s%2], "burst", "b", rate, 429)
			time.Sleep(time.Until(next))
		}
	}
	// Steady for the warm-up (3 s) and two seconds judged (for_s), a step
	// for three, and steady for three: two whole seconds above and two
	// back below, however the batches straddle the second boundaries.
	pace(8, 5)
	pace(80, 3)
	pace(8, 3)
	waitUntil(t, 15*time.Second, "the spike's end alert", func() bool {
		hookMu.Lock()
		defer hookMu.Unlock()
		for _, h := range hooks {
			if h["event"] == "spike.end" {
				return true
			}
		}
		return false
	})
	time.Sleep(2 * time.Second) // a second spike would have shown by now
	hookMu.Lock()
	defer hookMu.Unlock()
	var events []string
	for _, h := range hooks {
		events = append(events, fmt.Sprintf("%v %v/%v", h["event"], h["domain"], h["rule"]))
		if text, _ := h["text"].(string); !strings.Contains(text, "live / burst") {
			t.Errorf("alert text %q does not name the rule", text)
		}
		if u, _ := h["url"].(string); !strings.Contains(u, "/traffic?domain=live&rule=burst") {
			t.Errorf("alert url %q does not link to the rule's dashboard", u)
		}
	}
	if got, want := strings.Join(events, "; "), "spike.start live/burst; spike.end live/burst"; got != want {
		t.Errorf("alerts = %s, want %s", got, want)
	}
}
