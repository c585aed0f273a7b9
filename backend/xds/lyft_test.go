package xds_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/consoletest"
	"github.com/sluicehq/sluice/internal/testenv"
)

// lyftBin returns the envoyproxy/ratelimit service binary the
// compatibility tests run (SLUICE_LYFT_BIN, built by make test-compat at
// the version pinned there). Without it the tests skip, except under
// CI=true, where the compatibility tests must run: there scripts/test.sh
// runs the normal suite with SLUICE_COMPAT_STAGE=later and make
// test-compat right after it, which sets the binary.
func lyftBin(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("SLUICE_LYFT_BIN")
	switch {
	case bin != "":
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("SLUICE_LYFT_BIN: %v", err)
		}
		return bin
	case os.Getenv("SLUICE_COMPAT_STAGE") == "later":
		t.Skip("envoyproxy/ratelimit compatibility tests: run by make test-compat, the next stage")
	case os.Getenv("CI") == "true":
		t.Fatal("envoyproxy/ratelimit compatibility tests: SLUICE_LYFT_BIN is not set (CI=true): run make test-compat, which builds it")
	}
	t.Skip("envoyproxy/ratelimit compatibility tests: SLUICE_LYFT_BIN is not set; make test-compat builds envoyproxy/ratelimit and runs them")
	return ""
}

// lockedBuffer collects a process's output.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// lyft is a running envoyproxy/ratelimit process fed by the console's
// xDS server.
type lyft struct {
	grpcAddr string
	out      *lockedBuffer
}

// startLyft runs the envoyproxy/ratelimit binary as its documentation says
// for an xDS config source, counting in redisAddr.
func startLyft(t *testing.T, bin, xdsAddr, redisAddr, token, id, metadata string) *lyft {
	t.Helper()
	grpcPort := testenv.FreePort(t)
	l := &lyft{grpcAddr: "127.0.0.1:" + strconv.Itoa(grpcPort), out: &lockedBuffer{}}
	cmd := exec.Command(bin)
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOST=127.0.0.1", "PORT=" + strconv.Itoa(testenv.FreePort(t)),
		"GRPC_HOST=127.0.0.1", "GRPC_PORT=" + strconv.Itoa(grpcPort),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + strconv.Itoa(testenv.FreePort(t)),
		"USE_STATSD=false", "LOG_LEVEL=info",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redisAddr,
		"CONFIG_TYPE=GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL=" + xdsAddr,
		"CONFIG_GRPC_XDS_NODE_ID=" + id,
		"CONFIG_GRPC_XDS_NODE_METADATA=" + metadata,
		"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS=authorization:Bearer " + token,
		// Reconnect quickly after the console restarts (defaults: 10 s to 60 s).
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=200ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL=1s",
	}
	cmd.Stdout, cmd.Stderr = l.out, l.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("envoyproxy/ratelimit %s output:\n%s", id, l.out.String())
		}
	})
	return l
}

// check asks the process whether one request with descriptor entries is
// over limit in domain.
func (l *lyft) check(t *testing.T, domain string, entries ...string) (rls.RateLimitResponse_Code, error) {
	t.Helper()
	conn, err := grpc.NewClient(l.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var d rlcommon.RateLimitDescriptor
	for i := 0; i+1 < len(entries); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: entries[i], Value: entries[i+1]})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := rls.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rls.RateLimitRequest{Domain: domain, Descriptors: []*rlcommon.RateLimitDescriptor{&d}, HitsAddend: 1})
	if err != nil {
		return 0, err
	}
	return resp.GetOverallCode(), nil
}

// waitEnforcing waits until the process rejects probe value n of domain
// api: the version carrying that probe is in force.
func (l *lyft) waitEnforcing(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var err error
	for time.Now().Before(deadline) {
		var code rls.RateLimitResponse_Code
		if code, err = l.check(t, "api", "probe", strconv.FormatInt(n, 10)); err == nil && code == rls.RateLimitResponse_OVER_LIMIT {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("envoyproxy/ratelimit never enforced probe %d (last error %v)", n, err)
}

// enforces checks that the process allows user exactly limit times.
func (l *lyft) enforces(t *testing.T, user string, limit int) {
	t.Helper()
	for i := range limit + 1 {
		code, err := l.check(t, "api", "user", user)
		if err != nil {
			t.Fatalf("check %d of %s: %v", i+1, user, err)
		}
		want := rls.RateLimitResponse_OK
		if i == limit {
			want = rls.RateLimitResponse_OVER_LIMIT
		}
		if code != want {
			t.Fatalf("check %d of %s at limit %d = %v, want %v", i+1, user, limit, code, want)
		}
	}
}

// apiDomain limits each user to limit a day (a day, so that no window ends
// during the test) and rejects probe value probe.
func apiDomain(limit int, probe int64) string {
	return fmt.Sprintf(`domain: api
default_algorithm: fixed_window
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: %d}
  - key: probe
    value: "%d"
    rate_limit: {unit: day, requests_per_unit: 0}
`, limit, probe)
}

// clashDomain is valid in Sluice but refused by envoyproxy/ratelimit,
// which names a descriptor by its key and value joined with "_": a_b and
// c, a and b_c are one name there.
const clashDomain = `domain: clash
default_algorithm: fixed_window
descriptors:
  - key: a_b
    value: c
    rate_limit: {unit: day, requests_per_unit: 1, name: first}
  - key: a
    value: b_c
    rate_limit: {unit: day, requests_per_unit: 2, name: second}
`

// TestLyftCompat runs a stock envoyproxy/ratelimit against the console's
// xDS server: it enforces a publish, follows a second one, rejects a
// version it cannot load (the registry shows its error, and it keeps
// enforcing the version before), rides out a console restart, and a
// process with a wrong token gets nothing. Serial in itself (one process,
// one console, steps that build on each other); about ten seconds.
func TestLyftCompat(t *testing.T) {
	bin := lyftBin(t)
	t.Parallel()
	dbURL := testenv.PostgresURL(t)
	redis := testenv.StartRedis(t)
	xdsAddr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))

	// startConsole runs a console with its xDS server on xdsAddr; stop ends
	// it and waits.
	startConsole := func() (c *console, stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		ready := make(chan net.Addr, 1)
		base := consoletest.Start(t, ctx, &wg, backend.Config{DatabaseURL: dbURL, AdminPassword: "lyft-password",
			XDSListen: xdsAddr, XDSReady: func(a net.Addr) { ready <- a }}, nil)
		<-ready
		stop = func() {
			cancel()
			wg.Wait()
		}
		t.Cleanup(stop)
		return &console{base: base, xds: xdsAddr, admin: consoletest.Login(t, base, "admin", "lyft-password")}, stop
	}
	c, stop := startConsole()
	token := c.token(t, "lyft-1", "node")

	// A publish is enforced; the token bucket domain is not sent.
	c.publish(t, "bucket", bucketDomain, nil)
	v := c.publish(t, "api", apiDomain(3, 2), nil)
	l := startLyft(t, bin, xdsAddr, redis.Addr(), token, "lyft-1", "ring=canary,zone=a")
	l.waitEnforcing(t, 2)
	l.enforces(t, "u1", 3)
	row := c.waitNode(t, "lyft-1", "acked", func(n nodeRow) bool { return n.AppliedVersion == v })
	if row.Kind != "xds" || row.Labels["ring"] != "canary" || row.Labels["zone"] != "a" {
		t.Errorf("registry row %+v, want kind xds and labels ring=canary zone=a", row)
	}
	if len(row.UnsupportedDomains) != 1 || row.UnsupportedDomains[0].Domain != "bucket" {
		t.Errorf("unsupported domains %+v, want bucket", row.UnsupportedDomains)
	}
	if code, err := l.check(t, "bucket", "user", "u1"); err != nil || code != rls.RateLimitResponse_OK {
		t.Errorf("bucket check = %v, %v; want OK (a domain it does not have)", code, err)
	}

	// A second publish follows.
	v = c.publish(t, "api", apiDomain(5, 3), nil)
	l.waitEnforcing(t, 3)
	l.enforces(t, "u2", 5)
	c.waitNode(t, "lyft-1", "acked the second publish", func(n nodeRow) bool { return n.AppliedVersion == v })

	// A version it cannot load: its NACK and error land in the registry,
	// and it keeps the version it had.
	bad := c.publish(t, "clash", clashDomain, nil)
	row = c.waitNode(t, "lyft-1", "nacked", func(n nodeRow) bool { return n.NackVersion != nil })
	if *row.NackVersion != bad || row.AppliedVersion != v || !strings.Contains(row.NackError, "duplicate descriptor composite key") {
		t.Errorf("registry row %+v, want nack of %d (duplicate descriptor composite key) while on %d", row, bad, v)
	}
	l.enforces(t, "u3", 5)
	c.admin.MustDo(t, "DELETE", "/api/v1/domains/clash", map[string]any{"message": "Lyft refuses it", "base_version": bad}, 200, nil)
	c.version = bad + 1
	c.waitNode(t, "lyft-1", "acked the fix", func(n nodeRow) bool { return n.AppliedVersion == bad+1 && n.NackVersion == nil })

	// A console restart: it enforces meanwhile, reconnects with the
	// version it runs, and gets the next publish.
	stop()
	l.enforces(t, "u4", 5)
	c, _ = startConsole()
	c.version = bad + 1
	c.waitNode(t, "lyft-1", "reconnected", func(n nodeRow) bool { return n.Status == "connected" && n.AppliedVersion == bad+1 })
	v = c.publish(t, "api", apiDomain(2, 4), nil)
	l.waitEnforcing(t, 4)
	l.enforces(t, "u5", 2)
	c.waitNode(t, "lyft-1", "acked after the restart", func(n nodeRow) bool { return n.AppliedVersion == v })

	// A wrong token is refused, and says so in the process's log.
	wrong := startLyft(t, bin, xdsAddr, redis.Addr(), "sl_wrong", "lyft-2", "")
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(wrong.out.String(), "Unauthenticated") {
		if time.Now().After(deadline) {
			t.Fatalf("envoyproxy/ratelimit with a wrong token never logged Unauthenticated:\n%s", wrong.out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	var out struct {
		Nodes []nodeRow `json:"nodes"`
	}
	c.admin.MustDo(t, "GET", "/api/v1/nodes", nil, 200, &out)
	for _, n := range out.Nodes {
		if n.ID == "lyft-2" {
			t.Errorf("the wrong token's process is in the registry: %+v", n)
		}
	}
}
