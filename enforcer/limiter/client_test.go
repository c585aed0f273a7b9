package limiter

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testenv"
)

func TestNewClientStandalone(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		url         string
		opts        []ClientOption
		wantAddr    string
		wantDB      int
		wantTimeout time.Duration
		wantDial    time.Duration
		wantProto   int
	}{
		{"url", "redis://10.0.0.1:6380/2", nil, "10.0.0.1:6380", 2, DefaultTimeout, DefaultDialTimeout, 2},
		{"bare host:port", "10.0.0.1:6380", nil, "10.0.0.1:6380", 0, DefaultTimeout, DefaultDialTimeout, 2},
		{"options", "redis://h:1", []ClientOption{WithTimeout(time.Second), WithDialTimeout(2 * time.Second)}, "h:1", 0, time.Second, 2 * time.Second, 2},
		{"url query wins", "redis://h:1?read_timeout=200ms&dial_timeout=300ms&protocol=3", []ClientOption{WithTimeout(time.Second)}, "h:1", 0, 200 * time.Millisecond, 300 * time.Millisecond, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			uc, err := NewClient(tt.url, tt.opts...)
			if err != nil {
				t.Fatalf("NewClient: %v", err)
			}
			defer uc.Close()
			c, ok := uc.(*redis.Client)
			if !ok {
				t.Fatalf("NewClient returned %T, want *redis.Client", uc)
			}
			o := c.Options()
			if o.Addr != tt.wantAddr || o.DB != tt.wantDB {
				t.Errorf("addr %q db %d, want %q %d", o.Addr, o.DB, tt.wantAddr, tt.wantDB)
			}
			if o.ReadTimeout != tt.wantTimeout || o.WriteTimeout != tt.wantTimeout || o.PoolTimeout != tt.wantTimeout {
				t.Errorf("read/write/pool timeouts %v/%v/%v, want %v", o.ReadTimeout, o.WriteTimeout, o.PoolTimeout, tt.wantTimeout)
			}
			if o.DialTimeout != tt.wantDial {
				t.Errorf("dial timeout %v, want %v", o.DialTimeout, tt.wantDial)
			}
			if o.Protocol != tt.wantProto {
				t.Errorf("protocol %d, want RESP%d", o.Protocol, tt.wantProto)
			}
			// go-redis normalizes MaxRetries -1 to 0 (no retries).
			if o.MaxRetries != 0 || o.DialerRetries != 1 || !o.ContextTimeoutEnabled {
				t.Errorf("MaxRetries %d DialerRetries %d ContextTimeoutEnabled %v, want 0, 1, true",
					o.MaxRetries, o.DialerRetries, o.ContextTimeoutEnabled)
			}
		})
	}
}

func TestNewClientCluster(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		url   string
		addrs []string
		user  string
	}{
		{"seeds", "10.0.0.1:7000,10.0.0.2:7001", []string{"10.0.0.1:7000", "10.0.0.2:7001"}, ""},
		{"scheme", "redis+cluster://u:p@h1:7000,h2:7001,h3:7002", []string{"h1:7000", "h2:7001", "h3:7002"}, "u"},
		{"one seed", "redis+cluster://h1:7000/0", []string{"h1:7000"}, ""},
		{"tls", "rediss+cluster://h1:7000,h2:7001", []string{"h1:7000", "h2:7001"}, ""},
		{"redis scheme with seeds", "redis://u:p@h1:7000,h2:7001?read_timeout=50ms", []string{"h1:7000", "h2:7001"}, "u"},
		{"ipv6", "redis+cluster://[::1]:7000,[::1]:7001", []string{"[::1]:7000", "[::1]:7001"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			uc, err := NewClient(tt.url)
			if err != nil {
				t.Fatalf("NewClient: %v", err)
			}
			defer uc.Close()
			c, ok := uc.(*redis.ClusterClient)
			if !ok {
				t.Fatalf("NewClient returned %T, want *redis.ClusterClient", uc)
			}
			o := c.Options()
			if !slices.Equal(o.Addrs, tt.addrs) {
				t.Errorf("seeds %q, want %q", o.Addrs, tt.addrs)
			}
			if o.Username != tt.user {
				t.Errorf("user %q, want %q", o.Username, tt.user)
			}
			if o.ReadTimeout != DefaultTimeout || o.DialTimeout != DefaultDialTimeout || o.MaxRetries != -1 || o.DialerRetries != 1 || o.Protocol != 2 {
				t.Errorf("read %v dial %v MaxRetries %d DialerRetries %d protocol %d, want request-path defaults",
					o.ReadTimeout, o.DialTimeout, o.MaxRetries, o.DialerRetries, o.Protocol)
			}
		})
	}
}

func TestNewClientSentinel(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                       string
		url                        string
		sentinels                  []string
		master                     string
		db                         int
		user, pass                 string
		sentinelUser, sentinelPass string
		tls                        bool
		readTimeout                time.Duration
	}{
		{"one sentinel", "redis+sentinel://s1:26379/mymaster", []string{"s1:26379"}, "mymaster", 0, "", "", "", "", false, DefaultTimeout},
		{"three, db, password", "redis+sentinel://:p%40ss@s1:26379,s2:26380,[::1]:26381/mymaster/3", []string{"s1:26379", "s2:26380", "[::1]:26381"}, "mymaster", 3, "", "p@ss", "", "", false, DefaultTimeout},
		{"user and sentinel auth", "redis+sentinel://u:p@s1:1/m?sentinel_password=sp&sentinel_username=su&read_timeout=20ms", []string{"s1:1"}, "m", 0, "u", "p", "su", "sp", false, 20 * time.Millisecond},
		{"tls", "rediss+sentinel://s1:1,s2:2/m/0", []string{"s1:1", "s2:2"}, "m", 0, "", "", "", "", true, DefaultTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			form, ok, err := sentinelForm(tt.url)
			if err != nil || !ok {
				t.Fatalf("sentinelForm(%q) = %v, %v", tt.url, ok, err)
			}
			o, err := redis.ParseFailoverURL(form)
			if err != nil {
				t.Fatalf("ParseFailoverURL(%q): %v", form, err)
			}
			if !slices.Equal(o.SentinelAddrs, tt.sentinels) || o.MasterName != tt.master || o.DB != tt.db ||
				o.Username != tt.user || o.Password != tt.pass || o.SentinelUsername != tt.sentinelUser ||
				o.SentinelPassword != tt.sentinelPass || (o.TLSConfig != nil) != tt.tls {
				t.Errorf("got sentinels %v master %q db %d user %q pass %q sentinel %q/%q tls %v", o.SentinelAddrs, o.MasterName, o.DB,
					o.Username, o.Password, o.SentinelUsername, o.SentinelPassword, o.TLSConfig != nil)
			}
			uc, err := NewClient(tt.url)
			if err != nil {
				t.Fatal(err)
			}
			defer uc.Close()
			c, ok := uc.(*redis.Client)
			if !ok {
				t.Fatalf("NewClient returned %T, want a failover *redis.Client", uc)
			}
			if got := c.Options(); got.ReadTimeout != tt.readTimeout || got.DialTimeout != DefaultDialTimeout || got.MaxRetries != 0 || got.Protocol != 2 {
				t.Errorf("read %v dial %v MaxRetries %d protocol %d, want request-path defaults", got.ReadTimeout, got.DialTimeout, got.MaxRetries, got.Protocol)
			}
		})
	}
}

func TestNewClientInvalid(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		"",
		"http://h:1",
		"redis://h:1/notadb",
		"redis://h:1?no_such_option=1",
		"redis+cluster://",
		"redis+cluster://h1:7000/3",
		"h1,h2:7000",
		"redis+cluster://h1:7000?read_timeout=%zz",
		"redis+sentinel://s1:26379",
		"redis+sentinel://s1:26379/",
		"redis+sentinel:///m",
		"redis+sentinel://s1/m",
		"redis+sentinel://s1:1/m/x",
		"redis+sentinel://s1:1/m?master_name=other",
		"redis+sentinel://s1:1/m?no_such_option=1",
		"foo+sentinel://s1:1/m",
	} {
		if c, err := NewClient(raw); !errors.Is(err, ErrInvalidURL) {
			t.Errorf("NewClient(%q) = %v, %v; want ErrInvalidURL", raw, c, err)
		}
	}
	for _, raw := range []string{"redis://u:s3cret@h:port", "redis+cluster://u:s3cret@h:1,h:port", "redis+sentinel://u:s3cret@h:port/m", "redis+sentinel://u:s3cret@h:1/m?x=1"} {
		_, err := NewClient(raw)
		if err == nil || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("NewClient(%q) error %v: want an error without the password", raw, err)
		}
	}
}

// timeTake runs one Take against r and returns its duration and error.
func timeTake(ctx context.Context, r *Redis) (time.Duration, error) {
	start := time.Now()
	_, err := r.Take(ctx, []Request{{Key: "sluicetest:dead{x}", Limit: 1, Period: time.Second, Hits: 1}})
	return time.Since(start), err
}

func TestTakeDeadRedis(t *testing.T) {
	// Not parallel: it bounds how long a Take takes.
	// Nothing listens on port 1: every dial is refused.
	c, err := NewClient("redis://127.0.0.1:1/0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := NewRedis(c)
	for i := range 5 {
		d, err := timeTake(context.Background(), r)
		if err == nil {
			t.Fatal("Take against a dead Redis: no error")
		}
		t.Logf("Take #%d against dead Redis (connection refused): %v: %v", i+1, d, err)
		if d > time.Second {
			t.Errorf("Take #%d took %v, want well under 1s", i+1, d)
		}
	}
}

// hungServer accepts connections and never answers, like a Redis stuck in a
// long command or behind a dead network path that still completes handshakes.
func hungServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			go io.Copy(io.Discard, c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

func TestTakeHungRedis(t *testing.T) {
	// Not parallel: it bounds how long a Take takes.
	addr := hungServer(t)
	c, err := NewClient("redis://" + addr + "/0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := NewRedis(c)
	for i := range 3 {
		d, err := timeTake(context.Background(), r)
		if err == nil {
			t.Fatal("Take against a hung Redis: no error")
		}
		t.Logf("Take #%d against hung Redis (accepts, never answers): %v: %v", i+1, d, err)
		if d > time.Second {
			t.Errorf("Take #%d took %v, want well under 1s", i+1, d)
		}
	}

	// A caller's shorter deadline is honoured.
	c2, err := NewClient("redis://"+addr+"/0", WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	d, err := timeTake(ctx, NewRedis(c2))
	t.Logf("Take with a 20ms context deadline and a 5s client timeout: %v: %v", d, err)
	if err == nil || d > time.Second {
		t.Errorf("Take = %v after %v, want an error well under 1s", err, d)
	}
}

// proxy forwards TCP connections from a local address to target until
// stopped; start it again on the same address to simulate Redis returning.
type proxy struct {
	t      *testing.T
	addr   string
	target string
	mu     sync.Mutex
	ln     net.Listener
	conns  []net.Conn
}

func (p *proxy) start() {
	p.t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatalf("proxy listen %s: %v", p.addr, err)
	}
	p.mu.Lock()
	p.ln, p.addr = ln, ln.Addr().String()
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { io.Copy(up, c); up.Close() }()
			go func() { io.Copy(c, up); c.Close() }()
		}
	}()
}

func (p *proxy) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ln.Close()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func TestTakeRecoversWhenRedisReturns(t *testing.T) {
	// Not parallel: it bounds how long a Take takes.
	target := testenv.RedisURL(t)
	o, err := redis.ParseURL(target)
	if err != nil {
		t.Skipf("REDIS_URL %q is not a standalone URL: %v", target, err)
	}
	p := &proxy{t: t, addr: "127.0.0.1:0", target: o.Addr}
	p.start()
	t.Cleanup(p.stop)

	c, err := NewClient("redis://" + p.addr + "/" + strconv.Itoa(o.DB))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	prefix := testPrefix(t, testClient(t))
	r := NewRedis(c)
	req := Request{Key: testKey(prefix, "recover"), Limit: 100, Period: time.Hour, Hits: 1}
	if _, err := r.Take(context.Background(), []Request{req}); err != nil {
		t.Fatalf("Take through proxy: %v", err)
	}

	p.stop()
	// Enough failures to trip go-redis's dial circuit breaker (PoolSize).
	var worst time.Duration
	for range 50 {
		start := time.Now()
		if _, err := r.Take(context.Background(), []Request{req}); err == nil {
			t.Fatal("Take with Redis gone: no error")
		}
		worst = max(worst, time.Since(start))
	}
	t.Logf("worst of 50 Takes with Redis gone: %v", worst)

	p.start()
	back := time.Now()
	for {
		_, err := r.Take(context.Background(), []Request{req})
		if err == nil {
			break
		}
		if time.Since(back) > 5*time.Second {
			t.Fatalf("Take still failing 5s after Redis came back: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("Take succeeded %v after Redis came back", time.Since(back))
}
