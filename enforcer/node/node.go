// Package node builds an enforcer node's core, the same for the enforcer
// binary (enforcer.Run) and for a Go app's in-process node
// (middleware.NewNode): the Redis client with the request path's timeouts,
// the Batcher that pipelines and coalesces concurrent Takes, the engine
// behind a circuit breaker with the local fallback, the console
// subscription with the saved ruleset applied (or, in file mode, the rules
// directory it keeps the engine on), and the node's metrics. Servers,
// listeners and shutdown are the callers'.
package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/enforcer/breaker"
	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/enforcer/metrics"
	"github.com/sluicehq/sluice/enforcer/subscriber"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/wire"
)

// Config is what a node is built from: by enforcer.Run (the `sluice
// enforcer` flags, embedded in enforcer.Config) and by middleware.NewNode.
type Config struct {
	// ConsoleURL is the console's base URL (http:// or https://), or the
	// base URLs of several console replicas separated by commas, tried in
	// order. ConsoleURL or RulesDir is required, and only one of them.
	ConsoleURL string
	// NodeToken is the API token, with role node, the node presents to the
	// console.
	NodeToken string
	// RulesDir, instead of ConsoleURL, turns on file mode: no console, the
	// rules are the domain files in this directory (see Files), reloaded
	// when they change. NodeToken, StateDir and Labels do not apply, and
	// nothing is reported to a console.
	RulesDir string
	// NodeID names the node in the console; the hostname when empty.
	NodeID string
	// RedisURL is the counter store, in any form limiter.NewClient takes
	// (redis://host:port/db, host:port cluster seeds separated by commas,
	// redis+cluster://..., redis+sentinel://s1:p1,s2:p2/MASTER). Required.
	RedisURL string
	// StateDir keeps the last applied snapshot (subscriber.StateFile) so a
	// restart enforces before the console answers; empty keeps nothing.
	StateDir string
	// KeyPrefix starts every Redis key; engine.DefaultKeyPrefix ("sluice:")
	// when empty. Tests set a unique one.
	KeyPrefix string
	// StoreTimeout bounds each step of a check's Redis call (connecting,
	// waiting for a pooled connection, writing, reading);
	// limiter.DefaultTimeout (50 ms) when zero. Past it the limit's failure
	// mode answers.
	StoreTimeout time.Duration
	// AsyncFlushInterval is how often the node sends the hits of
	// consistency: async limits to Redis; engine.DefaultAsyncInterval
	// (100 ms) when zero.
	AsyncFlushInterval time.Duration
	// Labels and Build are reported to the console in Hello.
	Labels map[string]string
	Build  string
	// Region names the node's region when enforcers run in several, each
	// with its own Redis (RedisURL): scope: global limits then hold across
	// regions through GlobalRedisURL (see engine's "Regions"). Reported in
	// Hello. Empty: one region, and global limits count like any other.
	Region string
	// GlobalRedisURL is the store the regions exchange their counts of
	// global limits through, in any form RedisURL takes; it needs Region.
	// With Region but no GlobalRedisURL, each region enforces its share of
	// every global limit.
	GlobalRedisURL string
	// GlobalInterval is how often the node exchanges counts with the
	// global store (default 100 ms).
	GlobalInterval time.Duration
	// Registry, when set, receives the node's metrics (checks, store
	// errors, breaker state, console contact, console connected).
	Registry prometheus.Registerer
	// Log receives the node's events (subscription, saved ruleset, counter
	// store outages); discarded when nil.
	Log *slog.Logger
}

// Node is a built node: an engine kept on the console's ruleset. Run
// subscribes; Close releases Redis after Run has returned.
type Node struct {
	// Engine decides checks.
	Engine *engine.Engine
	// Subscriber keeps Engine on the console's ruleset; nil in file mode.
	Subscriber *subscriber.Subscriber
	// Files keeps Engine on the rules directory in file mode; nil
	// otherwise.
	Files *Files
	// Metrics records checks; nil without a Config.Registry.
	Metrics *metrics.Metrics
	// Redis is the counter store the engine counts in, for what serves
	// beside the engine (the RLQS presence sets).
	Redis *limiter.Redis

	id     string
	client io.Closer
	global io.Closer // the global store's client; nil without one
	ping   func(context.Context) error
}

// New validates cfg, fills its defaults and builds the node. Nothing is
// dialled yet (the Redis client dials on first use, the subscription in
// Run). The saved ruleset in StateDir, if any, is applied; a bad one is
// logged and ignored, since the console sends the current ruleset as soon
// as it answers.
//
// In file mode (RulesDir) the directory is loaded before New returns: an
// unreadable directory is an error, invalid rules are logged and leave the
// node without rules (not ready) until they are fixed.
func New(cfg Config) (*Node, error) {
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	switch {
	case cfg.ConsoleURL != "" && cfg.RulesDir != "":
		return nil, errors.New("console url and rules dir are mutually exclusive: a node takes its rules from the console or from a directory (file mode), not both")
	case cfg.ConsoleURL == "" && cfg.RulesDir == "":
		return nil, errors.New("console url is required (or a rules dir, for file mode)")
	}
	if cfg.RedisURL == "" {
		return nil, errors.New("redis url is required")
	}
	if cfg.GlobalRedisURL != "" && cfg.Region == "" {
		return nil, errors.New("global redis url needs a region: name the region this node runs in")
	}
	if err := wire.CheckRegion(cfg.Region); err != nil {
		return nil, err
	}
	if cfg.NodeID == "" {
		host, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("node id not set and no hostname: %w", err)
		}
		cfg.NodeID = host
	}
	cfg.KeyPrefix = cmp.Or(cfg.KeyPrefix, engine.DefaultKeyPrefix)
	if cfg.StoreTimeout <= 0 {
		cfg.StoreTimeout = limiter.DefaultTimeout
	}

	client, err := limiter.NewClient(cfg.RedisURL, limiter.WithTimeout(cfg.StoreTimeout), limiter.WithDialTimeout(cfg.StoreTimeout))
	if err != nil {
		return nil, err
	}
	rdb := limiter.NewRedis(client)
	// Lease: true limits are served from local leases on hot keys.
	// Consistency: async limits are counted on the node and flushed.
	opts := []engine.Option{engine.WithLeases(rdb, engine.LeaseOptions{Timeout: cfg.StoreTimeout}),
		engine.WithAsync(rdb, engine.AsyncOptions{Interval: cfg.AsyncFlushInterval})}
	if cfg.RulesDir != "" {
		opts = append(opts, engine.WithoutStats()) // no console to send them to
	}
	var global io.Closer
	if cfg.Region != "" {
		ro := engine.RegionOptions{Region: cfg.Region, Interval: cfg.GlobalInterval, Log: log}
		if cfg.GlobalRedisURL != "" {
			// Off the request path: a round may wait longer than a check.
			gc, err := limiter.NewClient(cfg.GlobalRedisURL, limiter.WithTimeout(time.Second), limiter.WithDialTimeout(time.Second))
			if err != nil {
				client.Close()
				return nil, fmt.Errorf("global redis url: %w", err)
			}
			ro.Global, global = limiter.NewGlobal(gc), gc
		}
		opts = append(opts, engine.WithRegions(ro))
	}
	n := &Node{
		id:     cfg.NodeID,
		client: client,
		global: global,
		Redis:  rdb,
		ping:   func(ctx context.Context) error { return limiter.Ping(ctx, client) },
		// The Batcher pipelines and coalesces the node's concurrent Takes
		// and answers limits known to be over from its cache. Its Timeout
		// bounds a check's whole wait, queueing included.
		Engine: NewEngine(limiter.NewBatcher(rdb, limiter.BatchOptions{Timeout: cfg.StoreTimeout}), cfg.KeyPrefix, log, opts...),
	}
	if cfg.RulesDir != "" {
		if err := n.fileMode(cfg, log); err != nil {
			n.closeClients()
			return nil, err
		}
		return n, nil
	}
	n.Subscriber, err = subscriber.New(subscriber.Config{
		ConsoleURL: cfg.ConsoleURL,
		NodeToken:  cfg.NodeToken,
		NodeID:     cfg.NodeID,
		Labels:     cfg.Labels,
		Build:      cfg.Build,
		Region:     cfg.Region,
		StateDir:   cfg.StateDir,
		// Per-rule counts and top limited values for the console.
		StatsSource: n.Engine.TakeStats,
		// Per-value hit histograms for the impact preview.
		PreviewSource: n.Engine.TakePreview,
		// Quota usage for billing.
		QuotaSource: n.Engine.TakeQuota,
		QuotaFull:   n.Engine.QuotaFull(),
	}, n.Engine, log)
	if err != nil {
		n.closeClients()
		return nil, err
	}
	if cfg.Registry != nil {
		if n.Metrics, err = n.register(cfg.Registry); err != nil {
			n.closeClients()
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	switch v, err := n.Subscriber.LoadState(); {
	case err == nil:
		log.Info("applied saved ruleset", "version", v, "state_dir", cfg.StateDir)
	case errors.Is(err, subscriber.ErrNoState):
	default:
		log.Warn("ignoring saved ruleset", "state_dir", cfg.StateDir, "error", err)
	}
	return n, nil
}

// fileMode builds the node's Files, with its metrics, and loads the
// directory once.
func (n *Node) fileMode(cfg Config, log *slog.Logger) error {
	var err error
	if n.Files, err = newFiles(cfg.RulesDir, n.Engine, log, cfg.Registry); err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	if cfg.Registry != nil {
		if n.Metrics, err = metrics.New(cfg.Registry, metrics.Options{Engine: n.Engine}); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
	}
	if err := n.Files.Load(); err != nil {
		var ve *rules.ValidationError
		if !errors.As(err, &ve) {
			return err // the directory itself is unusable
		}
		// Logged; the node serves, not ready, until the files are fixed.
	}
	return nil
}

// NewEngine returns the engine a node runs: store behind a circuit breaker,
// so an outage costs checks no waiting and the limits' failure modes
// answer. Each call is bounded by the store client's own timeouts (dial,
// pool wait, write and read, StoreTimeout each) rather than one deadline
// over all of them: a burst that queues for a pooled connection is not an
// outage, and a hung Redis opens the breaker within two timeouts.
//
// Failure_mode: local limits are counted by a limiter.Local meanwhile; the
// subscriber's SetNodeCount (the snapshot's node_count) gives it this
// node's share.
func NewEngine(store engine.Store, prefix string, log *slog.Logger, opts ...engine.Option) *engine.Engine {
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
	opts = append([]engine.Option{engine.WithBreaker(brk), engine.WithLocal(limiter.NewLocal(limiter.LocalOptions{}))}, opts...)
	return engine.New(store, prefix, opts...)
}

// register adds the node's metrics to reg.
func (n *Node) register(reg prometheus.Registerer) (*metrics.Metrics, error) {
	sub := n.Subscriber
	if err := reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_enforcer_console_connected",
		Help: "1 while the console subscription is up.",
	}, func() float64 {
		if sub.Connected() {
			return 1
		}
		return 0
	})); err != nil {
		return nil, err
	}
	return metrics.New(reg, metrics.Options{Engine: n.Engine, LastContact: sub.LastContact})
}

// ID is the node's id (Config.NodeID, or the hostname).
func (n *Node) ID() string { return n.id }

// Run keeps the console subscription up (in file mode: polls the rules
// directory) until ctx is done.
func (n *Node) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	regions := make(chan struct{})
	go func() {
		defer close(regions)
		n.Engine.RunRegions(ctx) // exchanges global counts; returns at once without regions
	}()
	defer func() {
		cancel()
		<-regions
	}()
	if n.Files != nil {
		return n.Files.Run(ctx)
	}
	return n.Subscriber.Run(ctx)
}

// Ping reports whether Redis answers (for /readyz).
func (n *Node) Ping(ctx context.Context) error { return n.ping(ctx) }

// Close returns the engine's unused leased units and flushes its pending
// async hits to Redis (for up to a second) and releases the Redis connections. Call it after Run has
// returned and the servers have stopped.
func (n *Node) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = n.Engine.Close(ctx) // leased units not returned are lost (under-admission); async hits not flushed, over-admission
	cancel()
	return n.closeClients()
}

// closeClients releases the Redis connections (and the global store's).
func (n *Node) closeClients() error {
	if n.global != nil {
		n.global.Close()
	}
	return n.client.Close()
}
