package middleware

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/enforcer/breaker"
	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/enforcer/metrics"
	"github.com/sluicehq/sluice/enforcer/subscriber"
)

// NodeConfig configures a Node. The fields mean what the enforcer's flags
// of the same names mean.
type NodeConfig struct {
	// ConsoleURL and NodeToken (a token with role node) subscribe to the
	// console. Required.
	ConsoleURL string
	NodeToken  string
	// NodeID names this process among the nodes; the hostname when empty.
	NodeID string
	// RedisURL is the counter store every enforcer shares. Required.
	RedisURL string
	// StateDir keeps the last applied ruleset so a restart enforces before
	// the console answers; empty keeps nothing.
	StateDir string
	// KeyPrefix starts every Redis key; the enforcer's default when empty.
	// Must match the enforcers' for the counters to be shared.
	KeyPrefix string
	// Labels and Build are reported to the console.
	Labels map[string]string
	Build  string
	// Registry, when set, receives the node's metrics.
	Registry prometheus.Registerer
	// Log receives the subscription's events; discarded when nil.
	Log *slog.Logger
}

// Node is an in-process enforcer: an engine counting in the shared Redis,
// behind a circuit breaker, kept on the console's ruleset by a
// subscription. Create Limiters from it for the app's handlers.
type Node struct {
	client  redis.UniversalClient
	eng     *engine.Engine
	sub     *subscriber.Subscriber
	metrics *metrics.Metrics
	log     *slog.Logger
}

// NewNode connects nothing yet: it builds the Redis client (which dials on
// first use), the engine and the subscription, and applies the saved
// ruleset from StateDir if there is one. Call Run to subscribe, Close when
// done.
func NewNode(cfg NodeConfig) (*Node, error) {
	if cfg.ConsoleURL == "" {
		return nil, errors.New("middleware: console url is required")
	}
	if cfg.RedisURL == "" {
		return nil, errors.New("middleware: redis url is required")
	}
	if cfg.NodeID == "" {
		host, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("middleware: node id not set and no hostname: %w", err)
		}
		cfg.NodeID = host
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	client, err := limiter.NewClient(cfg.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("middleware: %w", err)
	}
	eng := engine.New(limiter.NewRedis(client), cfg.KeyPrefix,
		engine.WithBreaker(breaker.New(breaker.Config{Hard: engine.StoreDown})))
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
		client.Close()
		return nil, fmt.Errorf("middleware: %w", err)
	}
	n := &Node{client: client, eng: eng, sub: sub, log: log}
	if cfg.Registry != nil {
		m, err := metrics.New(cfg.Registry, metrics.Options{Engine: eng, LastContact: sub.LastContact})
		if err != nil {
			client.Close()
			return nil, fmt.Errorf("middleware: metrics: %w", err)
		}
		n.metrics = m
	}
	switch _, err := sub.LoadState(); {
	case err == nil, errors.Is(err, subscriber.ErrNoState):
	default:
		log.Warn("ignoring saved ruleset", "state_dir", cfg.StateDir, "error", err)
	}
	return n, nil
}

// Run keeps the console subscription up until ctx is done.
func (n *Node) Run(ctx context.Context) error { return n.sub.Run(ctx) }

// Close releases the Redis connections. Call it after Run returned.
func (n *Node) Close() error { return n.client.Close() }

// Engine returns the node's engine.
func (n *Node) Engine() *engine.Engine { return n.eng }

// Ready reports whether a ruleset is applied; until then Limiters let
// every request through.
func (n *Node) Ready() bool { return n.eng.Loaded() }

// Limiter returns a Limiter on the node's engine; cfg.Metrics and cfg.Log
// default to the node's.
func (n *Node) Limiter(cfg Config) (*Limiter, error) {
	if cfg.Metrics == nil {
		cfg.Metrics = n.metrics
	}
	if cfg.Log == nil {
		cfg.Log = n.log
	}
	return New(n.eng, cfg)
}
