// Package gateway is the enforcer's gateway mode: a reverse proxy in front
// of one upstream that rate-limits every request by one rules domain.
//
// Each request's descriptors are built by the domain's request_descriptors
// in the applied ruleset (header, remote address with trusted-proxy
// handling of X-Forwarded-For, path, method, query parameter, fixed value),
// or by the client address alone when the domain has none. A request over a
// limit gets the limit's rejection status (on_limit's status, 429 by
// default) with rate-limit headers and an RFC 9457 problem+json body; for
// on_limit: delay limits it is held until the bucket lets it through, at
// most max_delay, and rejected after that. Allowed requests are proxied with httputil.ReverseProxy
// (bodies streamed both ways, hop-by-hop headers dropped, upgrades passed
// through, X-Forwarded-For/-Host/-Proto set) and the response carries the
// rate-limit headers.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/headers"
	"github.com/sluicehq/sluice/enforcer/metrics"
	"github.com/sluicehq/sluice/enforcer/middleware"
)

// Timeout defaults for the upstream.
const (
	DefaultDialTimeout           = 5 * time.Second
	DefaultResponseHeaderTimeout = 60 * time.Second
)

// Config configures a Gateway.
type Config struct {
	// Upstream is the base URL requests are proxied to. Required.
	Upstream *url.URL
	// Domain is the rules domain requests are checked against. Required.
	Domain string
	// TrustedProxies are the proxies in front of the gateway whose
	// X-Forwarded-For is believed, and extended rather than replaced.
	TrustedProxies []netip.Prefix
	// Metrics records the checks; nil records nothing.
	Metrics *metrics.Metrics
	// Transport reaches the upstream; nil means a transport with
	// DefaultDialTimeout and DefaultResponseHeaderTimeout.
	Transport http.RoundTripper
	// Log receives upstream failures.
	Log *slog.Logger
}

// Gateway is the rate-limiting reverse proxy; it is an http.Handler.
type Gateway struct {
	limiter *middleware.Limiter
	proxy   *httputil.ReverseProxy
	log     *slog.Logger

	// An unreachable upstream fails every request: log it once a second
	// with a count, not once per request.
	lastLog    atomic.Int64 // unix ns
	suppressed atomic.Int64
}

// New returns a Gateway proxying to cfg.Upstream, checking with eng.
func New(eng *engine.Engine, cfg Config) (*Gateway, error) {
	if cfg.Upstream == nil || cfg.Upstream.Scheme == "" || cfg.Upstream.Host == "" {
		return nil, errors.New("gateway: upstream must be an absolute URL")
	}
	if cfg.Upstream.Scheme != "http" && cfg.Upstream.Scheme != "https" {
		return nil, fmt.Errorf("gateway: upstream scheme %q: use http or https", cfg.Upstream.Scheme)
	}
	if cfg.Domain == "" {
		return nil, errors.New("gateway: domain is required")
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &Gateway{log: log}

	// No Descriptors: the limiter builds them by the domain's
	// request_descriptors in the applied ruleset (the client address when
	// it has none).
	trusted := cfg.TrustedProxies
	lim, err := middleware.New(eng, middleware.Config{
		Domain:         cfg.Domain,
		TrustedProxies: trusted,
		Metrics:        cfg.Metrics,
		Transport:      "gateway",
		Log:            log,
	})
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	g.limiter = lim

	transport := cfg.Transport
	if transport == nil {
		transport = NewTransport()
	}
	upstream := cfg.Upstream
	g.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			// A trusted proxy's X-Forwarded-For is extended; anyone else's
			// is dropped (Rewrite starts without it), so clients cannot
			// forge their address to the upstream.
			if ip := peerIP(pr.In); ip.IsValid() && trustedIP(ip, trusted) {
				if xff := pr.In.Header.Values("X-Forwarded-For"); len(xff) > 0 {
					pr.Out.Header["X-Forwarded-For"] = xff
				}
			}
			pr.SetXForwarded()
		},
		Transport:      transport,
		ModifyResponse: stripRateLimitHeaders,
		ErrorHandler:   g.proxyError,
		ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	return g, nil
}

// NewTransport returns the default upstream transport: http.DefaultTransport's
// settings with bounded dialing and time to the response headers, and
// enough idle connections per host for a busy gateway.
func NewTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = (&net.Dialer{Timeout: DefaultDialTimeout, KeepAlive: 30 * time.Second}).DialContext
	t.ResponseHeaderTimeout = DefaultResponseHeaderTimeout
	t.MaxIdleConns = 1024
	t.MaxIdleConnsPerHost = 256
	return t
}

// ServeHTTP checks r and proxies it, holds it, or rejects it.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !g.limiter.Allow(w, r) {
		return
	}
	g.proxy.ServeHTTP(w, r)
}

// Waiting returns the number of requests held by delay limits right now.
func (g *Gateway) Waiting() int { return g.limiter.Waiting() }

// stripRateLimitHeaders drops the upstream's own rate-limit fields: the
// gateway has set its own on the response, and two sets would contradict
// each other. The upstream's Retry-After (say, on its own 503) is kept: the
// gateway sets none on a request it let through.
func stripRateLimitHeaders(resp *http.Response) error {
	for _, name := range headers.Names {
		if name != headers.RetryAfter {
			resp.Header.Del(name)
		}
	}
	return nil
}

// proxyError answers when the upstream could not be reached or failed
// mid-request: 504 after a timeout, 502 otherwise, as problem+json.
func (g *Gateway) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return // the client went away; nobody to answer
	}
	status := http.StatusBadGateway
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		status = http.StatusGatewayTimeout
	}
	now := time.Now().UnixNano()
	if last := g.lastLog.Load(); now-last >= int64(time.Second) && g.lastLog.CompareAndSwap(last, now) {
		g.log.WarnContext(r.Context(), "upstream request failed",
			"method", r.Method, "path", r.URL.Path, "status", status, "error", err,
			"suppressed_since_last", g.suppressed.Swap(0))
	} else {
		g.suppressed.Add(1)
	}
	for _, name := range headers.Names {
		w.Header().Del(name)
	}
	headers.WriteProblem(w, headers.Problem{
		Type:     "about:blank",
		Title:    http.StatusText(status),
		Status:   status,
		Detail:   "The upstream service could not be reached.",
		Instance: r.URL.Path,
	})
}

func peerIP(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

func trustedIP(ip netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}
