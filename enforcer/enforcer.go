// Package enforcer is a Sluice enforcer node: it subscribes to the console
// for rulesets, counts requests in Redis, and answers rate-limit checks over
// HTTP (POST /json, POST /v1/check) and gRPC (Envoy RLS v3).
//
// Run wires the parts together; they live in sub-packages: engine (the
// decision core), checkserver (the HTTP and gRPC servers), subscriber (the
// console subscription and the on-disk last-known-good snapshot), headers
// (rate-limit response headers) and limiter (the Redis counters).
package enforcer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/enforcer/checkserver"
	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
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
}

// Run starts the node and serves until ctx is done, then shuts down
// gracefully: /readyz turns 503, HTTP and gRPC stop accepting and finish the
// checks in flight (bounded by ShutdownTimeout), the console websocket is
// closed with a close frame, and Redis is disconnected.
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

	client, err := limiter.NewClient(cfg.RedisURL)
	if err != nil {
		return fmt.Errorf("enforcer: %w", err)
	}
	defer client.Close()
	eng := engine.New(limiter.NewRedis(client), cfg.KeyPrefix)

	reg := prometheus.NewRegistry()
	sub, err := subscriber.New(subscriber.Config{
		ConsoleURL: cfg.ConsoleURL,
		NodeToken:  cfg.NodeToken,
		NodeID:     cfg.NodeID,
		Labels:     cfg.Labels,
		Build:      cfg.Build,
		StateDir:   cfg.StateDir,
		// Per-rule counts for the console, from the check servers' counter.
		StatsSource: subscriber.MetricStats(reg, "sluice_enforcer_rule_decisions_total"),
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
			Name: "sluice_enforcer_ruleset_version",
			Help: "Version of the ruleset this node enforces (0: none yet).",
		}, func() float64 { return float64(eng.Version()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_enforcer_console_connected",
			Help: "1 while the console subscription is up.",
		}, func() float64 {
			if sub.Connected() {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_enforcer_console_last_contact_timestamp_seconds",
			Help: "Unix time of the last message or pong from the console (0: never).",
		}, func() float64 {
			t := sub.LastContact()
			if t.IsZero() {
				return 0
			}
			return float64(t.UnixNano()) / 1e9
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_enforcer_console_contact_age_seconds",
			Help: "Seconds since the last message or pong from the console (since start when never).",
		}, func() float64 { return sub.ContactAge().Seconds() }),
	)
	checks, err := checkserver.New(eng, checkserver.Options{
		Registry: reg,
		Ping:     func(ctx context.Context) error { return limiter.Ping(ctx, client) },
		Log:      log,
	})
	if err != nil {
		return fmt.Errorf("enforcer: %w", err)
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

	httpSrv := &http.Server{
		Handler:           checks.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	grpcSrv := grpc.NewServer(grpc.MaxRecvMsgSize(checkserver.MaxBodyBytes))
	checks.RegisterGRPC(grpcSrv)

	log.InfoContext(ctx, "enforcer listening",
		"node_id", cfg.NodeID, "http_addr", httpLn.Addr().String(), "grpc_addr", grpcLn.Addr().String())
	if ready != nil {
		ready(httpLn.Addr(), grpcLn.Addr())
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
