package limiter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults of NewClient, chosen for the request path: a dead or hung Redis
// must cost a check tens of milliseconds, never seconds.
const (
	// DefaultTimeout bounds each socket read and write, and the wait for a
	// free pooled connection.
	DefaultTimeout = 50 * time.Millisecond
	// DefaultDialTimeout bounds establishing a connection (one attempt).
	DefaultDialTimeout = 50 * time.Millisecond
)

// ClientOption changes a setting of NewClient.
type ClientOption func(*clientConfig)

type clientConfig struct {
	timeout     time.Duration
	dialTimeout time.Duration
	poolSize    int
}

// WithTimeout sets the per-call read/write timeout and the wait for a pooled
// connection (default DefaultTimeout).
func WithTimeout(d time.Duration) ClientOption {
	return func(c *clientConfig) { c.timeout = d }
}

// WithDialTimeout sets the connection timeout (default DefaultDialTimeout).
func WithDialTimeout(d time.Duration) ClientOption {
	return func(c *clientConfig) { c.dialTimeout = d }
}

// WithPoolSize sets the number of pooled connections (per node on a cluster;
// default go-redis's 10 per GOMAXPROCS).
func WithPoolSize(n int) ClientOption {
	return func(c *clientConfig) { c.poolSize = n }
}

// ErrInvalidURL reports a Redis URL NewClient cannot use.
var ErrInvalidURL = errors.New("invalid redis url")

// NewClient returns a Redis client configured for the request path from raw:
//
//	redis://[user:pass@]host:port[/db]   standalone (also rediss://, unix://)
//	host:port                            standalone
//	host1:port1,host2:port2              Redis Cluster seeds
//	redis+cluster://[user:pass@]host1:port1,host2:port2   Redis Cluster
//	redis://[user:pass@]host1:port1,host2:port2           Redis Cluster
//	rediss+cluster://... or rediss://h1:p1,h2:p2          Redis Cluster over TLS
//	redis+sentinel://[[user]:pass@]s1:p1[,s2:p2...]/MASTER[/db]   Sentinel
//	rediss+sentinel://...                                 Sentinel, TLS to every node
//
// A Sentinel URL lists the sentinels' addresses (any number, comma-
// separated) and the name of the master they monitor; db defaults to 0. The
// userinfo is the master's (and its replicas') credentials, as in a
// redis:// URL. Sentinels that require a password of their own take it from
// the query parameters sentinel_password (and sentinel_username, with ACLs).
// The client (go-redis's failover client) asks the sentinels for the
// master's address, follows a failover when they announce it and closes its
// connections to the old master; commands in flight during the switch fail
// (no retries), and the rule's failure mode answers them.
//
// Unless raw's query parameters (go-redis names: read_timeout, dial_timeout,
// max_retries, pool_size, protocol, ...) or opts say otherwise, the client
// speaks RESP2 (see protocol), every call has a DefaultTimeout read and
// write timeout, connections get one dial attempt of DefaultDialTimeout,
// and failed commands are not retried, so a dead Redis
// costs a check about one timeout instead of go-redis's default ~1.7 s of
// retries and redials. After repeated dial failures go-redis fails calls
// at once and probes the server every second, so service resumes by itself.
// The caller owns the client and closes it.
func NewClient(raw string, opts ...ClientOption) (redis.UniversalClient, error) {
	cfg := clientConfig{timeout: DefaultTimeout, dialTimeout: DefaultDialTimeout}
	for _, o := range opts {
		o(&cfg)
	}
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return nil, fmt.Errorf("%w: empty", ErrInvalidURL)
	}

	if failoverURL, ok, err := sentinelForm(raw); err != nil {
		return nil, err
	} else if ok {
		o, err := redis.ParseFailoverURL(failoverURL)
		if err != nil {
			return nil, invalid(err)
		}
		cfg.apply(&o.ReadTimeout, &o.WriteTimeout, &o.DialTimeout, &o.PoolTimeout, &o.MaxRetries, &o.DialerRetries, &o.PoolSize)
		o.Protocol = protocol(o.Protocol)
		o.ContextTimeoutEnabled = true
		return redis.NewFailoverClient(o), nil
	}

	clusterURL, isCluster, err := clusterForm(raw)
	if err != nil {
		return nil, err
	}
	if isCluster {
		o, err := redis.ParseClusterURL(clusterURL)
		if err != nil {
			return nil, invalid(err)
		}
		cfg.apply(&o.ReadTimeout, &o.WriteTimeout, &o.DialTimeout, &o.PoolTimeout, &o.MaxRetries, &o.DialerRetries, &o.PoolSize)
		o.Protocol = protocol(o.Protocol)
		o.ContextTimeoutEnabled = true
		return redis.NewClusterClient(o), nil
	}

	if !strings.Contains(raw, "://") {
		raw = "redis://" + raw
	}
	o, err := redis.ParseURL(raw)
	if err != nil {
		return nil, invalid(err)
	}
	cfg.apply(&o.ReadTimeout, &o.WriteTimeout, &o.DialTimeout, &o.PoolTimeout, &o.MaxRetries, &o.DialerRetries, &o.PoolSize)
	o.Protocol = protocol(o.Protocol)
	o.ContextTimeoutEnabled = true
	return redis.NewClient(o), nil
}

// protocol returns the RESP version to speak: the URL's (protocol=3), or
// else RESP2. The limiter uses nothing of RESP3 (a script's reply is an
// array of integers either way), and on RESP2 go-redis does not look for
// push notifications around every command, which cost about 1.5 % of a
// node's CPU per check.
func protocol(p int) int {
	if p == 0 {
		return 2
	}
	return p
}

// apply fills the settings a URL left unset (zero) with c's values.
func (c clientConfig) apply(readTimeout, writeTimeout, dialTimeout, poolTimeout *time.Duration, maxRetries, dialerRetries, poolSize *int) {
	if *readTimeout == 0 {
		*readTimeout = c.timeout
	}
	if *writeTimeout == 0 {
		*writeTimeout = *readTimeout
	}
	if *dialTimeout == 0 {
		*dialTimeout = c.dialTimeout
	}
	if *poolTimeout == 0 && *readTimeout > 0 {
		// go-redis waits ReadTimeout + 1 s for a free connection by default.
		*poolTimeout = *readTimeout
	}
	if *maxRetries == 0 {
		*maxRetries = -1 // go-redis: -1 disables retries, 0 means 3
	}
	if *dialerRetries == 0 {
		*dialerRetries = 1 // one dial attempt per connection, no backoff loop
	}
	if *poolSize == 0 {
		*poolSize = c.poolSize // 0 keeps go-redis's default
	}
}

// hasSeedList reports whether the authority of a URL (rest is what follows
// "scheme://") names several hosts, which only a cluster can have.
func hasSeedList(rest string) bool {
	authority, _, _ := strings.Cut(rest, "/")
	authority, _, _ = strings.Cut(authority, "?")
	return strings.Contains(authority, ",")
}

func validPort(p string) bool {
	n, err := strconv.ParseUint(p, 10, 16)
	return err == nil && n > 0
}

// invalid wraps a URL parsing error as ErrInvalidURL without the URL itself,
// which may hold a password.
func invalid(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return fmt.Errorf("%w: %w", ErrInvalidURL, err)
}

// clusterForm reports whether raw names a Redis Cluster and, if so, rewrites
// it into the form redis.ParseClusterURL reads: the first seed as host, the
// others as addr query parameters.
func clusterForm(raw string) (string, bool, error) {
	scheme := "redis"
	var rest string
	switch {
	case strings.HasPrefix(raw, "redis+cluster://"):
		rest = strings.TrimPrefix(raw, "redis+cluster://")
	case strings.HasPrefix(raw, "rediss+cluster://"):
		scheme, rest = "rediss", strings.TrimPrefix(raw, "rediss+cluster://")
	case !strings.Contains(raw, "://") && strings.Contains(raw, ","):
		rest = raw
	case strings.HasPrefix(raw, "redis://") && hasSeedList(raw[len("redis://"):]):
		rest = strings.TrimPrefix(raw, "redis://")
	case strings.HasPrefix(raw, "rediss://") && hasSeedList(raw[len("rediss://"):]):
		scheme, rest = "rediss", strings.TrimPrefix(raw, "rediss://")
	default:
		return "", false, nil
	}

	rest, query, _ := strings.Cut(rest, "?")
	authority, path, _ := strings.Cut(rest, "/")
	if path != "" && path != "0" {
		return "", false, fmt.Errorf("%w: redis cluster has only database 0, got %q", ErrInvalidURL, "/"+path)
	}
	var userinfo string
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		userinfo, authority = authority[:i+1], authority[i+1:]
	}
	var seeds []string
	for s := range strings.SplitSeq(authority, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if h, p, err := net.SplitHostPort(s); err != nil || h == "" || !validPort(p) {
			return "", false, fmt.Errorf("%w: cluster seed %q is not host:port", ErrInvalidURL, s)
		}
		seeds = append(seeds, s)
	}
	if len(seeds) == 0 {
		return "", false, fmt.Errorf("%w: no cluster seeds", ErrInvalidURL)
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return "", false, invalid(err)
	}
	for _, s := range seeds[1:] {
		q.Add("addr", s)
	}
	u := scheme + "://" + userinfo + seeds[0]
	if enc := q.Encode(); enc != "" {
		u += "?" + enc
	}
	return u, true, nil
}

// sentinelForm reports whether raw is a redis+sentinel:// (or
// rediss+sentinel://) URL and, if so, rewrites it into the form
// redis.ParseFailoverURL reads: the first sentinel as host with the
// sentinels' credentials, the others as addr, the master's name as
// master_name and its credentials as username and password.
func sentinelForm(raw string) (string, bool, error) {
	scheme, rest, ok := strings.Cut(raw, "+sentinel://")
	if !ok {
		return "", false, nil
	}
	if scheme != "redis" && scheme != "rediss" {
		return "", false, fmt.Errorf("%w: unknown scheme %q", ErrInvalidURL, scheme+"+sentinel")
	}
	rest, query, _ := strings.Cut(rest, "?")
	authority, path, _ := strings.Cut(rest, "/")
	var user, pass string
	var hasPass bool
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		userinfo := authority[:i]
		authority = authority[i+1:]
		u, p, colon := strings.Cut(userinfo, ":")
		var err1, err2 error
		user, err1 = url.PathUnescape(u)
		pass, err2 = url.PathUnescape(p)
		if err1 != nil || err2 != nil {
			return "", false, fmt.Errorf("%w: malformed userinfo", ErrInvalidURL)
		}
		hasPass = colon
	}
	var sentinels []string
	for s := range strings.SplitSeq(authority, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if h, p, err := net.SplitHostPort(s); err != nil || h == "" || !validPort(p) {
			return "", false, fmt.Errorf("%w: sentinel %q is not host:port", ErrInvalidURL, s)
		}
		sentinels = append(sentinels, s)
	}
	if len(sentinels) == 0 {
		return "", false, fmt.Errorf("%w: no sentinel addresses", ErrInvalidURL)
	}
	master, db, _ := strings.Cut(path, "/")
	master, err := url.PathUnescape(master)
	if err != nil || master == "" {
		return "", false, fmt.Errorf("%w: sentinel URL needs the master name as its path (redis+sentinel://host:port/MASTER)", ErrInvalidURL)
	}
	if db == "" {
		db = "0"
	}
	if n, err := strconv.Atoi(db); err != nil || n < 0 {
		return "", false, fmt.Errorf("%w: database %q is not a number", ErrInvalidURL, db)
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return "", false, invalid(err)
	}
	for _, k := range []string{"master_name", "addr", "username", "password", "db"} {
		if q.Has(k) {
			return "", false, fmt.Errorf("%w: %s is set by the URL itself, not a query parameter", ErrInvalidURL, k)
		}
	}
	sentinelAuth := ""
	if q.Has("sentinel_password") || q.Has("sentinel_username") {
		sentinelAuth = url.UserPassword(q.Get("sentinel_username"), q.Get("sentinel_password")).String() + "@"
		q.Del("sentinel_username")
		q.Del("sentinel_password")
	}
	q.Set("master_name", master)
	for _, s := range sentinels[1:] {
		q.Add("addr", s)
	}
	if user != "" {
		q.Set("username", user)
	}
	if hasPass {
		q.Set("password", pass)
	}
	return scheme + "://" + sentinelAuth + sentinels[0] + "/" + db + "?" + q.Encode(), true, nil
}

// SetLogger sends go-redis's own log lines (dial failures, pool events), which
// otherwise go to the standard logger, to log at warn level. go-redis keeps
// one logger per process, so this is process-wide: call it once from main.
func SetLogger(log *slog.Logger) {
	redis.SetLogger(slogPrinter{log: log})
}

type slogPrinter struct{ log *slog.Logger }

func (p slogPrinter) Printf(ctx context.Context, format string, args ...any) {
	if !p.log.Enabled(ctx, slog.LevelWarn) {
		return
	}
	p.log.WarnContext(ctx, "redis client", "message", fmt.Sprintf(format, args...))
}
