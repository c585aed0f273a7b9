// Package enforcer is a Sluice enforcer node: it subscribes to the console
// for rulesets, counts requests in Redis, and answers rate-limit checks over
// HTTP (POST /json, POST /v1/check) and gRPC (Envoy RLS v3), and, in
// gateway mode, rate-limits the traffic it proxies to an upstream.
//
// Run wires the parts together; they live in sub-packages: engine (the
// decision core), breaker (the circuit breaker around Redis), checkserver
// (the HTTP and gRPC servers), gateway (the rate-limiting reverse proxy),
// middleware (the same for Go apps, in process), subscriber (the console
// subscription and the on-disk last-known-good snapshot), headers
// (rate-limit response headers and problem bodies), metrics (Prometheus)
// and limiter (the Redis counters).
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
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/enforcer/breaker"
	"github.com/sluicehq/sluice/enforcer/checkserver"
	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/gateway"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/enforcer/metrics"
	"github.com/sluicehq/sluice/enforcer/subscriber"
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

// Config is an enforcer node's configuration, as parsed by `sluice enforcer`.
type Config struct {
	// ConsoleURL is the console's base URL (http:// or https://), or the
	// base URLs of several console replicas separated by commas. Required.
	ConsoleURL string
	// NodeToken is the node-role API token the console authenticates with.
	NodeToken string
	// NodeID names this node in the console; the hostname when empty.
	NodeID string
	// RedisURL is the counter store: redis://host:port/db, a comma-separated
	// list of host:port cluster seeds, or redis+cluster://... Required.
	RedisURL string
	// HTTPAddr and GRPCAddr are the listen addresses (":0" picks a free
	// port); DefaultHTTPAddr and DefaultGRPCAddr when empty.
	HTTPAddr string
	GRPCAddr string
	// StateDir keeps the last applied snapshot (snapshot.json) so a restart
	// enforces before the console answers. Empty disables persistence.
	StateDir string
	// Labels and Build are reported to the console in Hello.
	Labels map[string]string
	Build  string
	// KeyPrefix starts every Redis key; DefaultKeyPrefix ("sluice:") when
	// empty. Tests set a unique one.
	KeyPrefix string
	// StoreTimeout bounds each step of a check's Redis call (connecting,
	// waiting for a pooled connection, writing, reading);
	// limiter.DefaultTimeout (50 ms) when zero. Past it the limit's failure
	// mode answers.
	StoreTimeout time.Duration

	// GatewayAddr, when set, turns on gateway mode: a reverse proxy on this
	// address to GatewayUpstream that rate-limits every request by
	// GatewayDomain's request_descriptors.
	GatewayAddr     string
	GatewayUpstream string
	GatewayDomain   string
	// GatewayTrustedProxies are the proxies in front of the gateway whose
	// X-Forwarded-For is believed (CIDR prefixes).
	GatewayTrustedProxies []netip.Prefix

	// Listening, if set, is called with every bound address (gateway
	// included) before anything is served.
	Listening func(Addrs)
}

// Addrs are the addresses a node listens on; Gateway is nil without
// gateway mode.
type Addrs struct {
	HTTP, GRPC, Gateway net.Addr
}

// newEngine returns the engine a node runs: store behind a circuit breaker,
// so an outage costs checks no waiting and the limits' failure modes
// answer. Each call is bounded by the store client's own timeouts (dial,
// pool wait, write and read, StoreTimeout each) rather than one deadline
// over all of them: a burst that queues for a pooled connection is not an
// outage, and a hung Redis opens the breaker within two timeouts.
//
// Failure_mode: local limits are counted by a limiter.Local meanwhile; the
// subscriber's SetNodeCount (the snapshot's node_count) gives it this
// node's share.
func newEngine(store engine.Store, prefix string, log *slog.Logger) *engine.Engine {
	brk := breaker.New(breaker.Config{
		Hard: engine.StoreDown,
		OnChange: func(from, to breaker.State) {
			// One line when an outage starts and one when it ends; the
			// half-open probes in between are not worth a line each.
			switch {
			case from == breaker.Closed:
				log.Warn("counter store unreachable: circuit breaker open, failure modes answer")
			case to == breaker.Closed:
				log.Warn("counter store reachable again: circuit breaker closed")
			}
		},
	})
	return engine.New(store, prefix, engine.WithBreaker(brk), engine.WithLocal(limiter.NewLocal(limiter.LocalOptions{})))
}

// Run starts the node and serves until ctx is done, then shuts down
// gracefully: /readyz turns 503, HTTP, gRPC and the gateway stop accepting
// and finish the requests in flight (bounded by ShutdownTimeout), the
// console websocket is closed with a close frame, and Redis is
// disconnected.
//
// The HTTP and gRPC listeners are bound before anything is served; ready, if
// not nil, is then called with their addresses (useful with ":0"). The saved
// snapshot in StateDir, if any, is applied before the listeners are bound.
// Run returns nil after a shutdown caused by ctx, or the error that stopped
// the node.
func Run(ctx context.Context, cfg Config, log *slog.Logger, ready func(http, grpc net.Addr)) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.ConsoleURL == "" {
		return errors.New("enforcer: console url is required")
	}
	if cfg.RedisURL == "" {
		return errors.New("enforcer: redis url is required")
	}
	if cfg.NodeID == "" {
		host, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("enforcer: node id not set and no hostname: %w", err)
		}
		cfg.NodeID = host
	}
	cfg.HTTPAddr = cmp.Or(cfg.HTTPAddr, DefaultHTTPAddr)
	cfg.GRPCAddr = cmp.Or(cfg.GRPCAddr, DefaultGRPCAddr)
	cfg.KeyPrefix = cmp.Or(cfg.KeyPrefix, DefaultKeyPrefix)

	var upstream *url.URL
	if cfg.GatewayAddr != "" {
		u, err := url.Parse(cfg.GatewayUpstream)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			// The URL is not echoed: it may carry credentials.
			return errors.New("enforcer: gateway upstream must be an http:// or https:// URL with a host")
		}
		if cfg.GatewayDomain == "" {
			return errors.New("enforcer: gateway domain is required in gateway mode")
		}
		upstream = u
	}

	if cfg.StoreTimeout <= 0 {
		cfg.StoreTimeout = limiter.DefaultTimeout
	}
	client, err := limiter.NewClient(cfg.RedisURL, limiter.WithTimeout(cfg.StoreTimeout), limiter.WithDialTimeout(cfg.StoreTimeout))
	if err != nil {
		return fmt.Errorf("enforcer: %w", err)
	}
	defer client.Close()
	// The Batcher pipelines and coalesces the node's concurrent Takes and
	// answers limits known to be over from its cache.
	// Its Timeout bounds a check's whole wait, queueing included.
	eng := newEngine(limiter.NewBatcher(limiter.NewRedis(client), limiter.BatchOptions{Timeout: cfg.StoreTimeout}), cfg.KeyPrefix, log)

	reg := prometheus.NewRegistry()
	sub, err := subscriber.New(subscriber.Config{
		ConsoleURL: cfg.ConsoleURL,
		NodeToken:  cfg.NodeToken,
		NodeID:     cfg.NodeID,
		Labels:     cfg.Labels,
		Build:      cfg.Build,
		StateDir:   cfg.StateDir,
		// Per-rule counts and top limited values for the console.
		StatsSource: eng.TakeStats,
	}, eng, log)
	if err != nil {
		return fmt.Errorf("enforcer: %w", err)
	}
	switch v, err := sub.LoadState(); {
	case err == nil:
		log.InfoContext(ctx, "applied saved ruleset", "version", v, "state_dir", cfg.StateDir)
	case errors.Is(err, subscriber.ErrNoState):
	default:
		// A bad state file must not keep the node down: the console will
		// send the current ruleset as soon as it is reachable.
		log.WarnContext(ctx, "ignoring saved ruleset", "state_dir", cfg.StateDir, "error", err)
	}

	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_enforcer_console_connected",
			Help: "1 while the console subscription is up.",
		}, func() float64 {
			if sub.Connected() {
				return 1
			}
			return 0
		}),
	)
	m, err := metrics.New(reg, metrics.Options{Engine: eng, LastContact: sub.LastContact})
	if err != nil {
		return fmt.Errorf("enforcer: metrics: %w", err)
	}
	checks, err := checkserver.New(eng, checkserver.Options{
		Registry: reg,
		Metrics:  m,
		Ping:     func(ctx context.Context) error { return limiter.Ping(ctx, client) },
		Log:      log,
	})
	if err != nil {
		return fmt.Errorf("enforcer: %w", err)
	}
	var gw *gateway.Gateway
	if upstream != nil {
		gw, err = gateway.New(eng, gateway.Config{
			Upstream:       upstream,
			Domain:         cfg.GatewayDomain,
			TrustedProxies: cfg.GatewayTrustedProxies,
			Metrics:        m,
			Log:            log,
		})
		if err != nil {
			return fmt.Errorf("enforcer: %w", err)
		}
	}

	var lc net.ListenConfig
	httpLn, err := lc.Listen(ctx, "tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("enforcer: listen http: %w", err)
	}
	defer httpLn.Close()
	grpcLn, err := lc.Listen(ctx, "tcp", cfg.GRPCAddr)
	if err != nil {
		return fmt.Errorf("enforcer: listen grpc: %w", err)
	}
	defer grpcLn.Close()
	var gwLn net.Listener
	if gw != nil {
		if gwLn, err = lc.Listen(ctx, "tcp", cfg.GatewayAddr); err != nil {
			return fmt.Errorf("enforcer: listen gateway: %w", err)
		}
		defer gwLn.Close()
	}

	httpSrv := &http.Server{
		Handler:           checks.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	// Stream workers: a check runs on a long-lived goroutine whose stack has
	// grown already, instead of a new one that grows its stack through the
	// check's deep call path on every RPC (copying it each time).
	grpcSrv := grpc.NewServer(grpc.MaxRecvMsgSize(checkserver.MaxBodyBytes), grpc.NumStreamWorkers(grpcStreamWorkers))
	checks.RegisterGRPC(grpcSrv)
	var gwSrv *http.Server
	if gw != nil {
		// No read or write timeout: bodies stream both ways and delay limits
		// hold requests. Header reads and idle connections are bounded.
		gwSrv = &http.Server{
			Handler:           gw,
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       2 * time.Minute,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
			BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
		}
	}

	log.InfoContext(ctx, "enforcer listening",
		"node_id", cfg.NodeID, "http_addr", httpLn.Addr().String(), "grpc_addr", grpcLn.Addr().String())
	addrs := Addrs{HTTP: httpLn.Addr(), GRPC: grpcLn.Addr()}
	if gwLn != nil {
		addrs.Gateway = gwLn.Addr()
		log.InfoContext(ctx, "gateway listening",
			"gateway_addr", gwLn.Addr().String(), "upstream", upstream.Redacted(), "domain", cfg.GatewayDomain)
	}
	if ready != nil {
		ready(httpLn.Addr(), grpcLn.Addr())
	}
	if cfg.Listening != nil {
		cfg.Listening(addrs)
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := httpSrv.Serve(httpLn); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve http: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		if err := grpcSrv.Serve(grpcLn); err != nil {
			return fmt.Errorf("serve grpc: %w", err)
		}
		return nil
	})
	if gwSrv != nil {
		g.Go(func() error {
			if err := gwSrv.Serve(gwLn); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve gateway: %w", err)
			}
			return nil
		})
	}
	g.Go(func() error { return sub.Run(gctx) })
	g.Go(func() error {
		<-gctx.Done()
		checks.Drain()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ShutdownTimeout)
		defer cancel()

		stopped := make(chan struct{})
		go func() {
			grpcSrv.GracefulStop()
			close(stopped)
		}()
		if gwSrv != nil {
			if err := gwSrv.Shutdown(sctx); err != nil {
				gwSrv.Close()
			}
		}
		err := httpSrv.Shutdown(sctx)
		if err != nil {
			httpSrv.Close()
		}
		select {
		case <-stopped:
		case <-sctx.Done():
			grpcSrv.Stop()
			<-stopped
		}
		if err != nil {
			return fmt.Errorf("shutdown http: %w", err)
		}
		return nil
	})
	err = g.Wait()
	log.InfoContext(context.WithoutCancel(ctx), "enforcer stopped", "node_id", cfg.NodeID)
	return err
}
