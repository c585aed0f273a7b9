package xds_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/client/sotw/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/consoletest"
	"github.com/sluicehq/sluice/internal/testenv"
)

// console is a running console with its xDS server, and its admin.
type console struct {
	base, xds string
	admin     *consoletest.Client
	version   int64 // the latest version, the base of the next publish
}

func startConsole(t *testing.T) *console {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	addr := make(chan net.Addr, 1)
	base := consoletest.Start(t, ctx, &wg, backend.Config{DatabaseURL: testenv.PostgresURL(t), AdminPassword: "xds-password",
		XDSListen: "127.0.0.1:0", XDSReady: func(a net.Addr) { addr <- a }}, nil)
	return &console{base: base, xds: (<-addr).String(), admin: consoletest.Login(t, base, "admin", "xds-password")}
}

func (c *console) token(t *testing.T, name, role string) string {
	t.Helper()
	var out struct {
		Token string `json:"token"`
	}
	c.admin.MustDo(t, "POST", "/api/v1/tokens", map[string]any{"name": name, "role": role}, 201, &out)
	return out.Token
}

// publish puts a domain and returns the new version.
func (c *console) publish(t *testing.T, domain, yaml string, rollout map[string]string) int64 {
	t.Helper()
	body := map[string]any{"yaml": yaml, "message": "test", "base_version": c.version}
	if rollout != nil {
		body["rollout"] = map[string]any{"labels": rollout}
	}
	var out struct {
		Version int64 `json:"version"`
	}
	c.admin.MustDo(t, "PUT", "/api/v1/domains/"+domain, body, 200, &out)
	c.version = out.Version
	return out.Version
}

type nodeRow struct {
	ID                 string            `json:"id"`
	Kind               string            `json:"kind"`
	Status             string            `json:"status"`
	AppliedVersion     int64             `json:"applied_version"`
	NackVersion        *int64            `json:"nack_version"`
	NackError          string            `json:"nack_error"`
	Labels             map[string]string `json:"labels"`
	UnsupportedDomains []struct {
		Domain  string   `json:"domain"`
		Reasons []string `json:"reasons"`
	} `json:"unsupported_domains"`
}

// waitNode waits until node id's registry row satisfies ok.
func (c *console) waitNode(t *testing.T, id string, what string, ok func(nodeRow) bool) nodeRow {
	t.Helper()
	// Generous: a loaded machine may take seconds to reconnect a client
	// after a console restart; a passing run waits far less.
	deadline := time.Now().Add(30 * time.Second)
	var last nodeRow
	for time.Now().Before(deadline) {
		var out struct {
			Nodes []nodeRow `json:"nodes"`
		}
		c.admin.MustDo(t, "GET", "/api/v1/nodes", nil, 200, &out)
		for _, n := range out.Nodes {
			if n.ID == id {
				last = n
				if ok(n) {
					return n
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("node %s never %s; last row %+v", id, what, last)
	return last
}

// client is an xDS client as envoyproxy/ratelimit runs it: go-control-plane's
// ADS client with the token in the stream's metadata.
type client struct {
	ads  sotw.ADSClient
	conn *grpc.ClientConn
}

func dial(t *testing.T, addr, token, id string, labels map[string]string) *client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	md := map[string]*structpb.Value{}
	for k, v := range labels {
		md[k] = structpb.NewStringValue(v)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := &client{ads: sotw.NewADSClient(ctx, &core.Node{Id: id, Metadata: &structpb.Struct{Fields: md}}, resource.RateLimitConfigType), conn: conn}
	// io.EOF: the console ended the stream before its first request was
	// sent (a refused token); Fetch then returns the stream's status.
	if err := c.ads.InitConnect(conn); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return c
}

// fetch waits for the next response and returns its domains by name.
func (c *client) fetch(t *testing.T) map[string]*rlsconf.RateLimitConfig {
	t.Helper()
	resp, err := c.ads.Fetch()
	if err != nil {
		t.Fatalf("fetch: %v", err)
	}
	out := map[string]*rlsconf.RateLimitConfig{}
	for _, a := range resp.Resources {
		var conf rlsconf.RateLimitConfig
		if err := a.UnmarshalTo(&conf); err != nil {
			t.Fatal(err)
		}
		out[conf.Name] = &conf
	}
	return out
}

func fixedDomain(name string, limit int) string {
	return fmt.Sprintf("domain: %s\ndefault_algorithm: fixed_window\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", name, limit)
}

const bucketDomain = "domain: bucket\ndescriptors:\n  - key: user\n    burst: 20\n    rate_limit: {unit: second, requests_per_unit: 10}\n"

// TestXDSPublishAckNack: a client gets the Lyft-expressible domains of the
// latest version, and the registry shows what it cannot run; its ACK is
// its applied version, its NACK its error, and a rejected version is not
// sent again: the next publish is.
func TestXDSPublishAckNack(t *testing.T) {
	t.Parallel()
	c := startConsole(t)
	c.publish(t, "bucket", bucketDomain, nil)
	v := c.publish(t, "api", fixedDomain("api", 5), nil)
	cl := dial(t, c.xds, c.token(t, "lyft-1", "node"), "lyft-1", map[string]string{"zone": "a"})

	got := cl.fetch(t)
	if len(got) != 1 || got["api"] == nil || got["api"].Descriptors[0].RateLimit.RequestsPerUnit != 5 {
		t.Fatalf("first response = %v, want domain api alone at 5", got)
	}
	if err := cl.ads.Ack(); err != nil {
		t.Fatal(err)
	}
	row := c.waitNode(t, "lyft-1", "acked "+strconv.FormatInt(v, 10), func(n nodeRow) bool { return n.AppliedVersion == v })
	if row.Kind != "xds" || row.Status != "connected" || row.Labels["zone"] != "a" {
		t.Errorf("row = %+v, want kind xds, connected, labels zone=a", row)
	}
	if len(row.UnsupportedDomains) != 1 || row.UnsupportedDomains[0].Domain != "bucket" ||
		!strings.Contains(strings.Join(row.UnsupportedDomains[0].Reasons, " "), "token_bucket") {
		t.Errorf("unsupported domains = %+v, want bucket (token_bucket)", row.UnsupportedDomains)
	}

	// A second publish follows; the client refuses it.
	v2 := c.publish(t, "api", fixedDomain("api", 6), nil)
	if got := cl.fetch(t); got["api"].Descriptors[0].RateLimit.RequestsPerUnit != 6 {
		t.Fatalf("second response = %v, want api at 6", got)
	}
	if err := cl.ads.Nack("duplicate descriptor composite key 'api.user'"); err != nil {
		t.Fatal(err)
	}
	row = c.waitNode(t, "lyft-1", "nacked", func(n nodeRow) bool { return n.NackVersion != nil })
	if *row.NackVersion != v2 || row.AppliedVersion != v || !strings.Contains(row.NackError, "duplicate descriptor composite key") {
		t.Errorf("row = %+v, want nack of %d with its error, applied %d", row, v2, v)
	}

	// Not sent again: the next response is the next version.
	v3 := c.publish(t, "api", fixedDomain("api", 7), nil)
	if got := cl.fetch(t); got["api"].Descriptors[0].RateLimit.RequestsPerUnit != 7 {
		t.Fatalf("response after the nack = %v, want api at 7 (version %d)", got, v3)
	}
	if err := cl.ads.Ack(); err != nil {
		t.Fatal(err)
	}
	c.waitNode(t, "lyft-1", "acked "+strconv.FormatInt(v3, 10), func(n nodeRow) bool { return n.AppliedVersion == v3 && n.NackVersion == nil })
}

// TestXDSReconnectKeepsVersion: a client that reconnects with the version
// it runs is sent nothing until a newer version exists.
func TestXDSReconnectKeepsVersion(t *testing.T) {
	t.Parallel()
	c := startConsole(t)
	v := c.publish(t, "api", fixedDomain("api", 5), nil)
	tok := c.token(t, "lyft-r", "node")
	first := dial(t, c.xds, tok, "lyft-r", nil)
	first.fetch(t)
	if err := first.ads.Ack(); err != nil {
		t.Fatal(err)
	}
	c.waitNode(t, "lyft-r", "acked", func(n nodeRow) bool { return n.AppliedVersion == v })
	first.conn.Close()
	c.waitNode(t, "lyft-r", "disconnected", func(n nodeRow) bool { return n.Status == "disconnected" })

	// The same process on a new stream says which version it runs (the
	// ADS client carries the last acked version_info).
	again := &client{ads: first.ads}
	conn, err := grpc.NewClient(c.xds, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := again.ads.InitConnect(conn); err != nil {
		t.Fatal(err)
	}
	c.waitNode(t, "lyft-r", "reconnected", func(n nodeRow) bool { return n.Status == "connected" && n.AppliedVersion == v })
	v2 := c.publish(t, "api", fixedDomain("api", 8), nil)
	if got := again.fetch(t); got["api"].Descriptors[0].RateLimit.RequestsPerUnit != 8 {
		t.Fatalf("response after reconnecting = %v, want only version %d", got, v2)
	}
}

// TestXDSStagedRollout: a staged version goes to the clients whose node
// metadata match its labels; the promote brings it to the others.
func TestXDSStagedRollout(t *testing.T) {
	t.Parallel()
	c := startConsole(t)
	v1 := c.publish(t, "api", fixedDomain("api", 5), nil)
	canary := dial(t, c.xds, c.token(t, "canary", "node"), "canary", map[string]string{"ring": "canary"})
	rest := dial(t, c.xds, c.token(t, "rest", "node"), "rest", map[string]string{"ring": "main"})
	for _, cl := range []*client{canary, rest} {
		cl.fetch(t)
		if err := cl.ads.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	v2 := c.publish(t, "api", fixedDomain("api", 9), map[string]string{"ring": "canary"})
	if got := canary.fetch(t); got["api"].Descriptors[0].RateLimit.RequestsPerUnit != 9 {
		t.Fatalf("canary got %v, want the staged version", got)
	}
	if err := canary.ads.Ack(); err != nil {
		t.Fatal(err)
	}
	c.waitNode(t, "canary", "on the staged version", func(n nodeRow) bool { return n.AppliedVersion == v2 })
	if row := c.waitNode(t, "rest", "listed", func(nodeRow) bool { return true }); row.AppliedVersion != v1 {
		t.Errorf("rest runs %d during the rollout, want %d", row.AppliedVersion, v1)
	}
	c.admin.MustDo(t, "POST", fmt.Sprintf("/api/v1/versions/%d/promote", v2), map[string]string{"message": "go"}, 200, nil)
	if got := rest.fetch(t); got["api"].Descriptors[0].RateLimit.RequestsPerUnit != 9 {
		t.Fatalf("rest got %v after the promote, want the promoted version", got)
	}
	if err := rest.ads.Ack(); err != nil {
		t.Fatal(err)
	}
	c.waitNode(t, "rest", "on the promoted version", func(n nodeRow) bool { return n.AppliedVersion == v2 })
}

// TestXDSRefused: a stream without a node token, with a wrong one, with a
// token of another role or as another token's node id gets nothing.
func TestXDSRefused(t *testing.T) {
	t.Parallel()
	c := startConsole(t)
	c.publish(t, "api", fixedDomain("api", 5), nil)
	bound := c.token(t, "bound", "node")
	b := dial(t, c.xds, bound, "node-a", nil)
	b.fetch(t)
	for _, tc := range []struct {
		name, token, id string
		code            codes.Code
	}{
		{"no token", "", "n1", codes.Unauthenticated},
		{"wrong token", "sl_not-a-token", "n1", codes.Unauthenticated},
		{"editor token", c.token(t, "ed", "editor"), "n1", codes.PermissionDenied},
		{"bound to another id", bound, "node-b", codes.PermissionDenied},
		{"another token's node id", c.token(t, "other", "node"), "node-a", codes.PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := dial(t, c.xds, tc.token, tc.id, nil)
			_, err := cl.ads.Fetch()
			if got := status.Code(err); got != tc.code {
				t.Errorf("fetch error %v (code %v), want %v", err, got, tc.code)
			}
		})
	}
	// The refused streams left no registry rows.
	c.waitNode(t, "node-a", "listed", func(nodeRow) bool { return true })
	var out struct {
		Nodes []nodeRow `json:"nodes"`
	}
	c.admin.MustDo(t, "GET", "/api/v1/nodes", nil, 200, &out)
	ids := []string{}
	for _, n := range out.Nodes {
		ids = append(ids, n.ID)
	}
	if !slices.Equal(ids, []string{"node-a"}) {
		t.Errorf("registry holds %v, want node-a alone", ids)
	}
}

// TestXDSTokenRevoked: disabling a connected client's token ends its
// stream.
func TestXDSTokenRevoked(t *testing.T) {
	t.Parallel()
	c := startConsole(t)
	c.publish(t, "api", fixedDomain("api", 5), nil)
	var tok struct {
		ID    int64  `json:"id"`
		Token string `json:"token"`
	}
	c.admin.MustDo(t, "POST", "/api/v1/tokens", map[string]any{"name": "rev", "role": "node"}, 201, &tok)
	cl := dial(t, c.xds, tok.Token, "rev", nil)
	cl.fetch(t)
	if err := cl.ads.Ack(); err != nil {
		t.Fatal(err)
	}
	c.admin.MustDo(t, "POST", fmt.Sprintf("/api/v1/tokens/%d/disable", tok.ID), map[string]any{}, 200, nil)
	_, err := cl.ads.Fetch()
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("fetch after the token was disabled: %v, want Unauthenticated", err)
	}
	c.waitNode(t, "rev", "disconnected", func(n nodeRow) bool { return n.Status == "disconnected" })
}

// TestXDSFleetToken: any node id may join on a fleet token, and an id that
// is connected already is refused rather than taken over.
func TestXDSFleetToken(t *testing.T) {
	t.Parallel()
	c := startConsole(t)
	c.publish(t, "api", fixedDomain("api", 5), nil)
	var tok struct {
		Token string `json:"token"`
	}
	c.admin.MustDo(t, "POST", "/api/v1/tokens", map[string]any{"name": "fleet", "role": "node", "fleet": true}, 201, &tok)
	first := dial(t, c.xds, tok.Token, "lyft-a", nil)
	first.fetch(t)
	second := dial(t, c.xds, tok.Token, "lyft-b", nil)
	second.fetch(t)
	dup := dial(t, c.xds, tok.Token, "lyft-a", nil)
	if _, err := dup.ads.Fetch(); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("a second lyft-a: %v, want AlreadyExists", err)
	}
	// The first lyft-a still gets versions.
	c.publish(t, "api", fixedDomain("api", 6), nil)
	if err := first.ads.Ack(); err != nil {
		t.Fatal(err)
	}
	if got := first.fetch(t); got["api"].Descriptors[0].RateLimit.RequestsPerUnit != 6 {
		t.Fatalf("lyft-a got %v, want api at 6", got)
	}
}
