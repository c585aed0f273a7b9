package middleware

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/node"
)

// NodeConfig configures a Node: the enforcer binary's node settings
// (package node), whose fields mean what the enforcer's flags of the same
// names mean.
type NodeConfig = node.Config

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
	cfg.Log = log
	n, err := node.New(cfg)
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
