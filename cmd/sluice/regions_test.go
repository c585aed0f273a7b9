package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/enforcer"
	"github.com/sluicehq/sluice/enforcer/node"
)

const regionsDomain = `domain: geo
descriptors:
  - key: user
    algorithm: fixed_window
    scope: global
    rate_limit: {unit: hour, requests_per_unit: 100}
`

// TestRegionsFromHellos: nodes name their region in their hello; the
// console lists it in GET /api/v1/nodes and counts the regions in the
// snapshots it sends; a node of a region without a global store then
// enforces its region's share of a global limit (limit / regions).
func TestRegionsFromHellos(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	f := startRollFleet(t, ctx, &wg)

	regions := map[string]string{"eu-1": "eu", "eu-2": "eu", "us-1": "us"}
	addrs := map[string]chan string{}
	for id, region := range regions {
		var tok struct {
			Token string `json:"token"`
		}
		f.admin.MustDo(t, "POST", "/api/v1/tokens", map[string]string{"name": "geo-" + id, "role": "node"}, 201, &tok)
		ready := make(chan string, 1)
		addrs[id] = ready
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := enforcer.Config{Config: node.Config{ConsoleURL: f.consoles[0], NodeToken: tok.Token, NodeID: id, RedisURL: f.redis,
				Region: region, StateDir: t.TempDir(), KeyPrefix: f.prefix + region + ":"},
				HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0"}
			err := enforcer.Run(ctx, cfg, slog.New(slog.DiscardHandler), func(a enforcer.Addrs) { ready <- a.HTTP.String() })
			if err != nil && ctx.Err() == nil {
				t.Errorf("enforcer %s: %v", id, err)
			}
		}()
	}
	type view struct {
		ID     string `json:"id"`
		Region string `json:"region"`
		Status string `json:"status"`
	}
	waitUntil(t, 10*time.Second, "the nodes to show their regions", func() bool {
		var out struct {
			Nodes []view `json:"nodes"`
		}
		f.admin.MustDo(t, "GET", "/api/v1/nodes", nil, 200, &out)
		ok := 0
		for _, n := range out.Nodes {
			if n.Status == "connected" && regions[n.ID] != "" && n.Region == regions[n.ID] {
				ok++
			}
		}
		return ok == len(regions)
	})

	var v struct {
		Version int64 `json:"version"`
	}
	f.admin.MustDo(t, "PUT", "/api/v1/domains/geo", map[string]any{"yaml": regionsDomain, "message": "a global limit", "base_version": 0}, 200, &v)
	eu := <-addrs["eu-1"]
	waitUntil(t, 10*time.Second, "eu-1 to load the rules", func() bool { return geoCheck(t, eu) != 0 })
	// The first check counted. Two regions: eu's share of 100 is 50.
	admitted := 1
	for range 60 {
		if geoCheck(t, eu) == http.StatusOK {
			admitted++
		}
	}
	if admitted != 50 {
		t.Fatalf("eu-1 admitted %d of 61 checks of a global limit of 100 in 2 regions without a global store, want its share 50", admitted)
	}
}

// geoCheck sends one check of the geo domain: 200, 429, or 0 while the node
// has no rules for it.
func geoCheck(t *testing.T, node string) int {
	t.Helper()
	body := `{"domain":"geo","descriptors":[{"entries":[{"key":"user","value":"u1"}]}]}`
	resp, err := http.Post("http://"+node+"/json", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
		return 0
	}
	return resp.StatusCode
}
