// Package enforcer is a Sluice enforcer node: it subscribes to the console
// for rulesets (or, in file mode, reads them from a directory of Lyft-format
// files), counts requests in Redis, and answers rate-limit checks over
// HTTP (POST /json, POST /v1/check) and gRPC (Envoy RLS v3), serves Envoy's
// Rate Limit Quota Service on the same gRPC port, and, in gateway mode,
// rate-limits the traffic it proxies to an upstream.
//
// Run wires the parts together; they live in sub-packages: node (the core
// that Run and middleware both build: Redis client, engine, subscription,
// metrics), engine (the decision core), breaker (the circuit breaker around
// Redis), checkserver (the HTTP and gRPC servers), rlqs (the Rate Limit
// Quota Service), gateway (the
// rate-limiting reverse proxy), middleware (the same for Go apps, in
// process), subscriber (the console subscription and the on-disk
// last-known-good snapshot), headers (rate-limit response headers and
// problem bodies), metrics (Prometheus) and limiter (the Redis counters).
package enforcer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/enforcer/checkserver"
	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/gateway"
	"github.com/sluicehq/sluice/enforcer/node"
	"github.com/sluicehq/sluice/enforcer/rlqs"
	"github.com/sluicehq/sluice/internal/serve"
)

// Defaults used by Run for empty Config fields.
const (
	DefaultHTTPAddr  = ":8081"
	DefaultGRPCAddr  = ":8082"
	DefaultKeyPrefix = engine.DefaultKeyPrefix
	// ShutdownTimeout bounds the graceful part of shutdown; after it, open
	// connections are cut.
	ShutdownTimeout = 10 * time.Second
)

// grpcStreamWorkers is how many goroutines serve gRPC checks. More
// concurrent checks than that still run, each on a goroutine of its own.
const grpcStreamWorkers = 256

// Config is an enforcer node's configuration, as parsed by `sluice enforcer`:
// the node's (node.Config) and the servers in front of it. Run ignores the
// node's Registry and Log: it registers the node's metrics on the registry
// it serves at /metrics and logs to its log argument.
type Config struct {
	node.Config
	// HTTPAddr and GRPCAddr are the listen addresses (":0" picks a free
	// port); DefaultHTTPAddr and DefaultGRPCAddr when empty.
	HTTPAddr string
	GRPCAddr string

	// GatewayAddr, when set, turns on gateway mode: a reverse proxy on this
	// address to GatewayUpstream that rate-limits every request by
	// GatewayDomain's request_descriptors.
	GatewayAddr     string
	GatewayUpstream string
	GatewayDomain   string
	// GatewayTrustedProxies are the proxies in front of the gateway whose
	// X-Forwarded-For is believed (CIDR prefixes).
	GatewayTrustedProxies []netip.Prefix
}

// Addrs are the addresses a node listens on; Gateway is nil without
// gateway mode.
type Addrs struct {
	HTTP, GRPC, Gateway net.Addr
}

// Run starts the node and serves until ctx is done, then shuts down
// gracefully: /readyz turns 503, HTTP, gRPC and the gateway stop accepting
// and finish the requests in flight (bounded by ShutdownTimeout), the
// console websocket is closed with a close frame, and Redis is
// disconnected.
//
// The listeners are bound before anything is served; ready, if not nil, is
// then called with their addresses (useful with ":0"). The saved snapshot
// in StateDir, if any, is applied before the listeners are bound. Run
// returns nil after a shutdown caused by ctx, or the error that stopped the
// node.
func Run(ctx context.Context, cfg Config, log *slog.Logger, ready func(Addrs)) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	upstream, err := cfg.check()
	if err != nil {
		return fmt.Errorf("enforcer: %w", err)
	}
	srv, err := build(ctx, cfg, upstream, log)
	if err != nil {
		return fmt.Errorf("enforcer: %w", err)
	}
	defer srv.node.Close()
	lns, err := listen(ctx, cfg)
	if err != nil {
		return fmt.Errorf("enforcer: %w", err)
	}
	defer lns.close()

	addrs := lns.addrs()
	log.InfoContext(ctx, "enforcer listening",
		"node_id", srv.node.ID(), "http_addr", addrs.HTTP.String(), "grpc_addr", addrs.GRPC.String())
	if addrs.Gateway != nil {
		log.InfoContext(ctx, "gateway listening",
			"gateway_addr", addrs.Gateway.String(), "upstream", upstream.Redacted(), "domain", cfg.GatewayDomain)
	}
	if ready != nil {
		ready(addrs)
	}
	err = srv.serve(ctx, lns)
	log.InfoContext(context.WithoutCancel(ctx), "enforcer stopped", "node_id", srv.node.ID())
	return err
}

// check fills cfg's defaults and validates what node.New does not: the
// listen addresses and gateway mode, whose upstream it returns (nil
// without gateway mode).
func (cfg *Config) check() (*url.URL, error) {
	cfg.HTTPAddr = cmp.Or(cfg.HTTPAddr, DefaultHTTPAddr)
	cfg.GRPCAddr = cmp.Or(cfg.GRPCAddr, DefaultGRPCAddr)
	if cfg.GatewayAddr == "" {
		return nil, nil
	}
	u, err := url.Parse(cfg.GatewayUpstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		// The URL is not echoed: it may carry credentials.
		return nil, errors.New("gateway upstream must be an http:// or https:// URL with a host")
	}
	if cfg.GatewayDomain == "" {
		return nil, errors.New("gateway domain is required in gateway mode")
	}
	return u, nil
}

// server is a built node and its servers, not yet serving.
type server struct {
	node    *node.Node
	checks  *checkserver.Server
	quota   *rlqs.Server
	http    *http.Server
	grpc    *grpc.Server
	gateway *http.Server // nil without gateway mode
}

// build builds the node (node.New: Redis, Batcher, engine, breaker,
// subscriber, metrics) and the servers in front of it: HTTP and gRPC
// checks, and the gateway when upstream is set.
func build(ctx context.Context, cfg Config, upstream *url.URL, log *slog.Logger) (*server, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	nc := cfg.Config
	nc.Registry, nc.Log = reg, log
	n, err := node.New(nc)
	if err != nil {
		return nil, err
	}
	s := &server{node: n}
	if s.checks, err = checkserver.New(n.Engine, checkserver.Options{
		Registry: reg,
		Metrics:  n.Metrics,
		Ping:     n.Ping,
		Log:      log,
	}); err != nil {
		n.Close()
		return nil, err
	}
	// Requests outlive a cancelled ctx: shutdown finishes them.
	base := func(net.Listener) context.Context { return context.WithoutCancel(ctx) }
	s.http = serve.Server(s.checks.Handler(), serve.Limits{ReadHeader: 5 * time.Second, Read: 30 * time.Second, Idle: 2 * time.Minute}, log)
	s.http.BaseContext = base
	// Stream workers: a check runs on a long-lived goroutine whose stack has
	// grown already, instead of a new one that grows its stack through the
	// check's deep call path on every RPC (copying it each time).
	s.grpc = grpc.NewServer(grpc.MaxRecvMsgSize(checkserver.MaxBodyBytes), grpc.NumStreamWorkers(grpcStreamWorkers))
	s.checks.RegisterGRPC(s.grpc)
	if s.quota, err = rlqs.New(n.Engine, n.Redis, rlqs.Options{NodeID: n.ID(), Registry: reg, Log: log}); err != nil {
		n.Close()
		return nil, err
	}
	s.quota.RegisterGRPC(s.grpc)
	if upstream == nil {
		return s, nil
	}
	gw, err := gateway.New(n.Engine, gateway.Config{
		Upstream:       upstream,
		Domain:         cfg.GatewayDomain,
		TrustedProxies: cfg.GatewayTrustedProxies,
		Metrics:        n.Metrics,
		Log:            log,
	})
	if err != nil {
		n.Close()
		return nil, err
	}
	// No read or write timeout: bodies stream both ways and delay limits
	// hold requests. Header reads and idle connections are bounded.
	s.gateway = serve.Server(gw, serve.Limits{ReadHeader: 10 * time.Second, Idle: 2 * time.Minute}, log)
	s.gateway.BaseContext = base
	return s, nil
}

// listeners are a node's bound listeners; gateway is nil without gateway
// mode.
type listeners struct {
	http, grpc, gateway net.Listener
}

// listen binds the HTTP, gRPC and (with GatewayAddr) gateway addresses.
func listen(ctx context.Context, cfg Config) (*listeners, error) {
	var lc net.ListenConfig
	lns := &listeners{}
	var err error
	if lns.http, err = lc.Listen(ctx, "tcp", cfg.HTTPAddr); err != nil {
		return nil, fmt.Errorf("listen http: %w", err)
	}
	if lns.grpc, err = lc.Listen(ctx, "tcp", cfg.GRPCAddr); err != nil {
		lns.close()
		return nil, fmt.Errorf("listen grpc: %w", err)
	}
	if cfg.GatewayAddr != "" {
		if lns.gateway, err = lc.Listen(ctx, "tcp", cfg.GatewayAddr); err != nil {
			lns.close()
			return nil, fmt.Errorf("listen gateway: %w", err)
		}
	}
	return lns, nil
}

func (l *listeners) addrs() Addrs {
	a := Addrs{HTTP: l.http.Addr(), GRPC: l.grpc.Addr()}
	if l.gateway != nil {
		a.Gateway = l.gateway.Addr()
	}
	return a
}

func (l *listeners) close() {
	for _, ln := range []net.Listener{l.http, l.grpc, l.gateway} {
		if ln != nil {
			ln.Close()
		}
	}
}

// serve serves on lns and runs the console subscription until ctx is done
// or one of them fails, then shuts down.
func (s *server) serve(ctx context.Context, lns *listeners) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := s.http.Serve(lns.http); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve http: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		// ErrServerStopped: shutdown stopped the server before Serve ran.
		if err := s.grpc.Serve(lns.grpc); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("serve grpc: %w", err)
		}
		return nil
	})
	if s.gateway != nil {
		g.Go(func() error {
			if err := s.gateway.Serve(lns.gateway); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve gateway: %w", err)
			}
			return nil
		})
	}
	g.Go(func() error { return s.node.Run(gctx) })
	g.Go(func() error {
		<-gctx.Done()
		return s.shutdown(context.WithoutCancel(ctx))
	})
	return g.Wait()
}

// shutdown turns /readyz 503 and stops the servers: they stop accepting
// and finish the requests in flight, for at most ShutdownTimeout; then
// what is left is cut.
func (s *server) shutdown(ctx context.Context) error {
	s.checks.Drain()
	sctx, cancel := context.WithTimeout(ctx, ShutdownTimeout)
	defer cancel()

	// RLQS streams last as long as their clients: end them (the clients
	// reconnect to another enforcer) so GracefulStop need not wait for them.
	s.quota.Close()
	stopped := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(stopped)
	}()
	if s.gateway != nil {
		if err := s.gateway.Shutdown(sctx); err != nil {
			s.gateway.Close()
		}
	}
	err := s.http.Shutdown(sctx)
	if err != nil {
		s.http.Close()
	}
	select {
	case <-stopped:
	case <-sctx.Done():
		s.grpc.Stop()
		<-stopped
	}
	if err != nil {
		return fmt.Errorf("shutdown http: %w", err)
	}
	return nil
}
