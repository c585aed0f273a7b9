package middleware

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/node"
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
	// StoreTimeout bounds each step of a check's Redis call; the
	// enforcer's default (50 ms) when zero. Past it the limit's failure
	// mode answers.
	StoreTimeout time.Duration
	// Labels and Build are reported to the console.
	Labels map[string]string
	Build  string
	// Registry, when set, receives the node's metrics.
	Registry prometheus.Registerer
	// Log receives the node's events (subscription, saved ruleset, counter
	// store outages); discarded when nil.
	Log *slog.Logger
}

// Node is an in-process enforcer, built as the enforcer binary builds its
// node (package node): an engine counting in the shared Redis through the
// Batcher, behind a circuit breaker with the local fallback, kept on the
// console's ruleset by a subscription. Create Limiters from it for the
// app's handlers.
type Node struct {
	n   *node.Node
	log *slog.Logger
}

// NewNode connects nothing yet: it builds the Redis client (which dials on
// first use), the engine and the subscription, and applies the saved
// ruleset from StateDir if there is one. Call Run to subscribe, Close when
// done.
func NewNode(cfg NodeConfig) (*Node, error) {
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	n, err := node.New(node.Config{
		ConsoleURL:   cfg.ConsoleURL,
		NodeToken:    cfg.NodeToken,
		NodeID:       cfg.NodeID,
		RedisURL:     cfg.RedisURL,
		StateDir:     cfg.StateDir,
		KeyPrefix:    cfg.KeyPrefix,
		StoreTimeout: cfg.StoreTimeout,
		Labels:       cfg.Labels,
		Build:        cfg.Build,
		Registry:     cfg.Registry,
	}, log)
	if err != nil {
		return nil, fmt.Errorf("middleware: %w", err)
	}
	return &Node{n: n, log: log}, nil
}

// Run keeps the console subscription up until ctx is done.
func (n *Node) Run(ctx context.Context) error { return n.n.Run(ctx) }

// Close releases the Redis connections. Call it after Run returned.
func (n *Node) Close() error { return n.n.Close() }

// Engine returns the node's engine.
func (n *Node) Engine() *engine.Engine { return n.n.Engine }

// Ready reports whether a ruleset is applied; until then Limiters let
// every request through.
func (n *Node) Ready() bool { return n.n.Engine.Loaded() }

// Limiter returns a Limiter on the node's engine; cfg.Metrics and cfg.Log
// default to the node's.
func (n *Node) Limiter(cfg Config) (*Limiter, error) {
	if cfg.Metrics == nil {
		cfg.Metrics = n.n.Metrics
	}
	if cfg.Log == nil {
		cfg.Log = n.log
	}
	return New(n.n.Engine, cfg)
}
