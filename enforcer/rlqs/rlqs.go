// Package rlqs serves Envoy's Rate Limit Quota Service
// (envoy.service.rate_limit_quota.v3.RateLimitQuotaService) on the
// enforcer's gRPC port. Envoy's rate_limit_quota filter sorts requests into
// buckets, admits them itself against a token bucket the server assigns
// per bucket, and reports per bucket how many it allowed and denied; the
// server counts the reports into the same Redis counters the RLS and HTTP
// checks take from, and divides each limit between the clients reporting
// for it.
//
// # Buckets
//
// The stream's domain (RateLimitQuotaUsageReports.domain, the filter's
// domain; required in the first message, and a later message may repeat it
// but not change it) is a Sluice domain. A bucket id's key/value pairs are
// the entries of one descriptor of that domain, ordered as its descriptor
// tree nests their keys (engine.Engine.Bucket, rules.Set.MatchUnordered):
// bucket {name: checkout, env: prod} matches the rule key name, value
// checkout, with a child of key env, and counts on the same counter as the
// RLS descriptor [(name, checkout), (env, prod)].
//
// # Assignments
//
// Each bucket gets a QuotaAssignmentAction whose strategy follows its limit:
//
//   - no limit matches (an unknown domain, keys no rule nests, a path that
//     ends without a limit), an unlimited limit, or a shadow_mode limit:
//     blanket_rule ALLOW_ALL, as an RLS check of the descriptor would be
//     allowed (shadow-mode usage is still counted and reported). To deny
//     unknown buckets, give the domain a catch-all rule with
//     requests_per_unit: 0;
//   - requests_per_unit 0: DENY_ALL;
//   - otherwise a token_bucket: with N clients reporting for the limit's
//     counter (a stream and bucket id each, counted fleet-wide in Redis),
//     tokens_per_fill is requests_per_unit and fill_interval N times the
//     limit's period, so the N buckets together refill at exactly the
//     limit's rate, and max_tokens is the capacity (burst, or the window's
//     limit) divided by N, rounded down, at least 1. A windowed algorithm
//     is approximated by that token bucket; the shared counter still counts
//     by the rule's algorithm.
//
// The shared counter has the last word. When a report leaves it empty
// (checks, other clients or rounding used it up), the bucket gets DENY_ALL
// until the counter has room again (read every Refresh); it then gets a
// token bucket whose max_tokens is at most its share of what the counter
// holds, raised as the counter refills (when the share has doubled, or is
// whole again). A new strategy gives Envoy a new, full bucket, so the
// clients never start with more than the counter holds.
//
// Assignments are re-sent when they change: a client joins or leaves a
// limit (the share changes, within one Refresh on every enforcer), the
// counter empties or refills, or a new ruleset version changes the limit.
// Unchanged, they are re-sent every AssignmentTTL/2 to extend them
// (assignment_time_to_live is AssignmentTTL), so a client whose enforcer
// went away falls back to its expired_assignment_behavior within
// AssignmentTTL.
//
// # Clients and expiry
//
// A client counts toward a bucket's share from its first report of it
// until its stream closes, or until it has not reported the bucket for the
// bucket's TTL: max(MinClientTTL, 3 × the longest of its last four
// intervals between reports), at most 10 minutes. The stream then drops
// the bucket and sends it an AbandonAction (Envoy forgets the bucket and
// subscribes afresh with its next request).
//
// # Counting and bounds
//
// A report's allowed requests are added to the counter whether or not they
// fit (engine.Engine.Report: at most the capacity plus the refill of the
// report's time_elapsed per bucket and report; buckets charged as of
// time_elapsed ago), denied ones count as limited in the stats. When Redis
// is unreachable the usage is not counted (the stats show no store
// errors for it) and assignments stay as they are. A stream holds at most
// MaxBuckets buckets; a report with more, a malformed bucket id (empty, an
// empty key or value, over the check bounds: engine.Engine.Bucket) or a
// missing domain ends the stream with InvalidArgument (ResourceExhausted
// for too many buckets); before the first ruleset it ends with
// Unavailable. A message is at most the gRPC server's receive limit (1 MiB).
package rlqs

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
)

// Defaults for Options.
const (
	DefaultRefresh       = time.Second
	DefaultMinClientTTL  = 30 * time.Second
	DefaultAssignmentTTL = 60 * time.Second
	DefaultMaxBuckets    = 10_000
	// MaxClientTTL caps a bucket's TTL however long a client's reporting
	// interval is.
	MaxClientTTL = 10 * time.Minute
)

// Options configures a Server.
type Options struct {
	// NodeID names this enforcer in the presence sets (with a random
	// suffix per stream).
	NodeID string
	// Refresh is how often a stream re-reads the shares of its buckets and
	// the counters of throttled ones; DefaultRefresh when zero.
	Refresh time.Duration
	// MinClientTTL is the least time a client keeps counting toward a
	// bucket's share after its last report of it; DefaultMinClientTTL when
	// zero.
	MinClientTTL time.Duration
	// AssignmentTTL is the assignments' assignment_time_to_live;
	// DefaultAssignmentTTL when zero.
	AssignmentTTL time.Duration
	// MaxBuckets bounds the buckets of one stream; DefaultMaxBuckets when
	// zero.
	MaxBuckets int
	// Registry, when set, receives the service's metrics.
	Registry prometheus.Registerer
	// Log receives store errors and streams ended by errors; discarded when
	// nil.
	Log *slog.Logger
}

// Server is the Rate Limit Quota Service of one enforcer.
type Server struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	eng      *engine.Engine
	presence *limiter.Redis
	opts     Options
	log      *slog.Logger

	ctx    context.Context // ended by Close
	cancel context.CancelFunc

	streams prometheus.Gauge
	reports *prometheus.CounterVec
}

// New returns a Server that resolves buckets and counts usage with eng and
// keeps the presence sets through presence (the node's Redis).
func New(eng *engine.Engine, presence *limiter.Redis, opts Options) (*Server, error) {
	if eng == nil || presence == nil {
		return nil, errors.New("rlqs: engine and redis are required")
	}
	opts.Refresh = cmp.Or(opts.Refresh, DefaultRefresh)
	opts.MinClientTTL = cmp.Or(opts.MinClientTTL, DefaultMinClientTTL)
	opts.AssignmentTTL = cmp.Or(opts.AssignmentTTL, DefaultAssignmentTTL)
	opts.MaxBuckets = cmp.Or(opts.MaxBuckets, DefaultMaxBuckets)
	s := &Server{eng: eng, presence: presence, opts: opts, log: opts.Log}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.streams = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_enforcer_rlqs_streams",
		Help: "Open Rate Limit Quota Service streams.",
	})
	s.reports = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_enforcer_rlqs_bucket_reports_total",
		Help: "Bucket usage reports received, by result: counted, or store_error (not counted).",
	}, []string{"result"})
	if opts.Registry != nil {
		for _, c := range []prometheus.Collector{s.streams, s.reports} {
			if err := opts.Registry.Register(c); err != nil {
				return nil, fmt.Errorf("rlqs metrics: %w", err)
			}
		}
	}
	return s, nil
}

// RegisterGRPC registers the RateLimitQuotaService on g.
func (s *Server) RegisterGRPC(g *grpc.Server) {
	rlqsv3.RegisterRateLimitQuotaServiceServer(g, s)
}

// Close ends every open stream (with Unavailable, so clients reconnect to
// another enforcer) and refuses new ones: call it before the gRPC server's
// GracefulStop, which would otherwise wait for these long-lived streams.
func (s *Server) Close() { s.cancel() }

// StreamRateLimitQuotas implements the RateLimitQuotaService.
func (s *Server) StreamRateLimitQuotas(gs grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) error {
	st := &stream{
		srv:     s,
		gs:      gs,
		id:      s.opts.NodeID + "/" + randomID(),
		buckets: make(map[string]*bucket),
	}
	s.streams.Inc()
	defer s.streams.Dec()
	err := st.run(gs.Context())
	st.leaveAll()
	return err
}

func randomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
