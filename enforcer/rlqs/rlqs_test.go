package rlqs_test

import (
	"context"
	"errors"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3common "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/enforcer/checkserver"
	"github.com/sluicehq/sluice/enforcer/node"
	"github.com/sluicehq/sluice/enforcer/rlqs"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

const edgeRules = `domain: edge
default_algorithm: token_bucket
descriptors:
  - key: name
    value: checkout
    rate_limit: {unit: minute, requests_per_unit: 10}
    descriptors:
      - key: env
        rate_limit: {unit: minute, requests_per_unit: 100}
  - key: name
    value: fast
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: name
    value: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: name
    value: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: name
    value: free
    rate_limit: {unlimited: true}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000}
`

// enforcer is a node with the RLS and RLQS services on one gRPC server, as
// enforcer.Run serves them, with short RLQS timings.
type enforcer struct {
	node *node.Node
	conn *grpc.ClientConn
}

func startEnforcer(t testing.TB, opts rlqs.Options) *enforcer {
	t.Helper()
	return startSharing(t, opts, testenv.KeyPrefix(t))
}

// startSharing starts an enforcer counting under prefix (two of them on one
// prefix are two enforcers of one fleet).
func startSharing(t testing.TB, opts rlqs.Options, prefix string) *enforcer {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(edgeRules), 0o600); err != nil {
		t.Fatal(err)
	}
	n, err := node.New(node.Config{RulesDir: dir, RedisURL: testenv.RedisURL(t), KeyPrefix: prefix, NodeID: "e1", StoreTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	checks, err := checkserver.New(n.Engine, checkserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	opts.NodeID = "e1"
	q, err := rlqs.New(n.Engine, n.Redis, opts)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	checks.RegisterGRPC(g)
	q.RegisterGRPC(g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(ln)
	t.Cleanup(func() {
		q.Close()
		g.Stop()
	})
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &enforcer{node: n, conn: conn}
}

func fastOptions() rlqs.Options {
	return rlqs.Options{Refresh: 20 * time.Millisecond, MinClientTTL: 400 * time.Millisecond, AssignmentTTL: time.Minute}
}

// check asks the RLS service about one descriptor.
func (e *enforcer) check(t testing.TB, entries ...string) *rlsv3.RateLimitResponse_DescriptorStatus {
	t.Helper()
	d := &rlsv3common.RateLimitDescriptor{}
	for i := 0; i < len(entries); i += 2 {
		d.Entries = append(d.Entries, &rlsv3common.RateLimitDescriptor_Entry{Key: entries[i], Value: entries[i+1]})
	}
	resp, err := rlsv3.NewRateLimitServiceClient(e.conn).ShouldRateLimit(context.Background(),
		&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlsv3common.RateLimitDescriptor{d}})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp.GetStatuses()[0]
}

// client speaks RLQS as Envoy's rate_limit_quota filter does: one stream,
// a usage report per bucket it knows every interval (the first one at
// once), the assignments it receives kept per bucket.
type client struct {
	t      testing.TB
	stream grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	buckets  map[string]map[string]string // reported, by bucketName
	allowed  map[string]uint64            // to report next
	actions  map[string]*rlqsv3.RateLimitQuotaResponse_BucketAction
	received chan struct{} // signalled on every response
	err      error         // the stream's end
}

func bucketName(id map[string]string) string {
	c := make([]string, 0, len(id))
	for k, v := range id {
		c = append(c, k+"="+v)
	}
	slices.Sort(c)
	return strings.Join(c, ",")
}

func (e *enforcer) connect(t testing.TB) *client {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(e.conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	c := &client{t: t, stream: stream, cancel: cancel, done: make(chan struct{}),
		buckets: map[string]map[string]string{}, allowed: map[string]uint64{},
		actions: map[string]*rlqsv3.RateLimitQuotaResponse_BucketAction{}, received: make(chan struct{}, 1)}
	go func() {
		defer close(c.done)
		for {
			resp, err := stream.Recv()
			c.mu.Lock()
			if err != nil {
				c.err = err
				c.mu.Unlock()
				c.signal()
				return
			}
			for _, a := range resp.GetBucketAction() {
				c.actions[bucketName(a.GetBucketId().GetBucket())] = a
			}
			c.mu.Unlock()
			c.signal()
		}
	}()
	t.Cleanup(c.close)
	return c
}

func (c *client) signal() {
	select {
	case c.received <- struct{}{}:
	default:
	}
}

func (c *client) close() {
	c.cancel()
	<-c.done
}

// report sends one usage report: for every known bucket what it admitted
// since the last one (none unless admit was called), for new ones too.
func (c *client) report(elapsed time.Duration, ids ...map[string]string) error {
	c.mu.Lock()
	for _, id := range ids {
		c.buckets[bucketName(id)] = id
	}
	m := &rlqsv3.RateLimitQuotaUsageReports{Domain: "edge"}
	for name, id := range c.buckets {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           &rlqsv3.BucketId{Bucket: id},
			TimeElapsed:        durationpb.New(elapsed),
			NumRequestsAllowed: c.allowed[name],
		})
		c.allowed[name] = 0
	}
	c.mu.Unlock()
	return c.stream.Send(m)
}

func (c *client) admit(id map[string]string, n uint64) {
	c.mu.Lock()
	c.allowed[bucketName(id)] += n
	c.mu.Unlock()
}

// forget stops reporting id, as Envoy does for a bucket no request matches.
func (c *client) forget(id map[string]string) {
	c.mu.Lock()
	delete(c.buckets, bucketName(id))
	c.mu.Unlock()
}

// reportEvery reports every interval until the test ends or stop is called.
func (c *client) reportEvery(interval time.Duration) (stop func()) {
	quit := make(chan struct{})
	var once sync.Once
	go func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				return
			case <-c.done:
				return
			case <-tick.C:
				if c.report(interval) != nil {
					return
				}
			}
		}
	}()
	stop = func() { once.Do(func() { close(quit) }) }
	c.t.Cleanup(stop)
	return stop
}

// await waits until the action for id satisfies ok.
func (c *client) await(id map[string]string, what string, ok func(*rlqsv3.RateLimitQuotaResponse_BucketAction) bool) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	c.t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		c.mu.Lock()
		a, err := c.actions[bucketName(id)], c.err
		c.mu.Unlock()
		if a != nil && ok(a) {
			return a
		}
		if err != nil {
			c.t.Fatalf("waiting for %s: stream ended: %v", what, err)
		}
		select {
		case <-c.received:
		case <-deadline:
			c.t.Fatalf("no %s for %v within 10s; last action %v", what, id, a)
		}
	}
}

// awaitEnd waits for the stream to end and returns its status code.
func (c *client) awaitEnd() (codes.Code, string) {
	c.t.Helper()
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		c.t.Fatal("stream did not end within 10s")
	}
	s, _ := status.FromError(c.err)
	if errors.Is(c.err, io.EOF) {
		return codes.OK, ""
	}
	return s.Code(), s.Message()
}

func tokenBucket(a *rlqsv3.RateLimitQuotaResponse_BucketAction) *typev3.TokenBucket {
	return a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
}

func blanket(a *rlqsv3.RateLimitQuotaResponse_BucketAction) (typev3.RateLimitStrategy_BlanketRule, bool) {
	s := a.GetQuotaAssignmentAction().GetRateLimitStrategy()
	if s == nil {
		return 0, false
	}
	b, ok := s.GetStrategy().(*typev3.RateLimitStrategy_BlanketRule_)
	if !ok {
		return 0, false
	}
	return b.BlanketRule, true
}

func share(maxTokens uint32, perFill uint32, interval time.Duration) func(*rlqsv3.RateLimitQuotaResponse_BucketAction) bool {
	return func(a *rlqsv3.RateLimitQuotaResponse_BucketAction) bool {
		tb := tokenBucket(a)
		return tb != nil && tb.GetMaxTokens() == maxTokens && tb.GetTokensPerFill().GetValue() == perFill &&
			tb.GetFillInterval().AsDuration() == interval
	}
}

var (
	checkout = map[string]string{"name": "checkout"}
	fast     = map[string]string{"name": "fast"}
)

// Reports count in the counter RLS checks use, both ways.
func TestReportsCountedInSharedCounter(t *testing.T) {
	t.Parallel()
	e := startEnforcer(t, fastOptions())
	c := e.connect(t)
	c.admit(checkout, 4)
	if err := c.report(time.Millisecond, checkout); err != nil {
		t.Fatal(err)
	}
	// 10/min, one client: the rate in full; the depth what the counter
	// holds after the report.
	a := c.await(checkout, "assignment", share(6, 10, time.Minute))
	if ttl := a.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration(); ttl != time.Minute {
		t.Errorf("assignment_time_to_live = %v, want 1m", ttl)
	}
	if s := e.check(t, "name", "checkout"); s.GetCode() != rlsv3.RateLimitResponse_OK || s.GetLimitRemaining() != 5 {
		t.Fatalf("RLS check after reporting 4 of 10: %v, want OK with 5 remaining", s)
	}
	// A nested bucket id counts on the nested rule's counter.
	nested := map[string]string{"env": "prod", "name": "checkout"}
	c.admit(nested, 30)
	if err := c.report(time.Millisecond, nested); err != nil {
		t.Fatal(err)
	}
	c.await(nested, "nested assignment", share(70, 100, time.Minute))
	if s := e.check(t, "name", "checkout", "env", "prod"); s.GetLimitRemaining() != 69 {
		t.Fatalf("RLS check of the nested descriptor: %v, want 69 remaining", s)
	}
}

// Two clients share one limit: the second one's arrival halves both
// shares; one that stops reporting stops counting after its TTL, one that
// closes its stream at once, and the other's share grows back.
func TestSharesFollowClients(t *testing.T) {
	t.Parallel()
	opts := fastOptions()
	prefix := testenv.KeyPrefix(t)
	e1 := startSharing(t, opts, prefix)
	e2 := startSharing(t, opts, prefix) // another enforcer of the fleet
	user := map[string]string{"user": "alice"}

	a := e1.connect(t)
	if err := a.report(time.Millisecond, user); err != nil {
		t.Fatal(err)
	}
	a.await(user, "whole share", share(1000, 1000, time.Minute))
	a.reportEvery(50 * time.Millisecond)

	b := e2.connect(t)
	if err := b.report(time.Millisecond, user); err != nil {
		t.Fatal(err)
	}
	b.await(user, "half share", share(500, 1000, 2*time.Minute))
	a.await(user, "half share", share(500, 1000, 2*time.Minute))
	stopB := b.reportEvery(50 * time.Millisecond)

	// A third client on the first enforcer: thirds.
	c := e1.connect(t)
	if err := c.report(time.Millisecond, user); err != nil {
		t.Fatal(err)
	}
	c.await(user, "third", share(333, 1000, 3*time.Minute))
	a.await(user, "third", share(333, 1000, 3*time.Minute))
	b.await(user, "third", share(333, 1000, 3*time.Minute))

	// The third closes its stream: halves again, without waiting for a TTL.
	c.close()
	a.await(user, "half share after a close", share(500, 1000, 2*time.Minute))

	// The second stops reporting the bucket but keeps its stream: after
	// its TTL it is told to abandon the bucket, and the first is alone.
	stopB()
	b.forget(user)
	b.await(user, "abandon", func(x *rlqsv3.RateLimitQuotaResponse_BucketAction) bool { return x.GetAbandonAction() != nil })
	a.await(user, "whole share back", share(1000, 1000, time.Minute))
}

// An empty counter denies until it has room again; a new ruleset version
// changes the assignment without a report.
func TestCounterStateAndRuleChanges(t *testing.T) {
	t.Parallel()
	e := startEnforcer(t, fastOptions())
	// 10/min, used up by checks: a report finds it empty.
	for range 10 {
		e.check(t, "name", "checkout")
	}
	c := e.connect(t)
	if err := c.report(time.Millisecond, checkout); err != nil {
		t.Fatal(err)
	}
	c.reportEvery(50 * time.Millisecond)
	c.await(checkout, "DENY_ALL", func(a *rlqsv3.RateLimitQuotaResponse_BucketAction) bool {
		r, ok := blanket(a)
		return ok && r == typev3.RateLimitStrategy_DENY_ALL
	})
	// 5/s, used up: tokens come back, and the depth with them, up to the
	// whole (through DENY_ALL first, unless a token is back already).
	for range 5 {
		e.check(t, "name", "fast")
	}
	if err := c.report(time.Millisecond, fast); err != nil {
		t.Fatal(err)
	}
	c.await(fast, "token bucket after the refill", share(5, 5, time.Second))

	// Version 2 raises the limit; the stream follows within a refresh.
	d, err := rules.Parse("edge.yaml", []byte(strings.Replace(edgeRules, "requests_per_unit: 5}", "requests_per_unit: 50}", 1)))
	if err != nil {
		t.Fatal(err)
	}
	s2, err := rules.Compile([]*rules.Domain{d})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.node.Engine.Apply(2, s2); err != nil {
		t.Fatal(err)
	}
	c.await(fast, "the new limit", func(a *rlqsv3.RateLimitQuotaResponse_BucketAction) bool {
		tb := tokenBucket(a)
		return tb != nil && tb.GetTokensPerFill().GetValue() == 50
	})
}

func TestBlanketRules(t *testing.T) {
	t.Parallel()
	e := startEnforcer(t, fastOptions())
	c := e.connect(t)
	for _, tc := range []struct {
		id   map[string]string
		want typev3.RateLimitStrategy_BlanketRule
	}{
		{map[string]string{"name": "unknown"}, typev3.RateLimitStrategy_ALLOW_ALL},
		{map[string]string{"color": "red"}, typev3.RateLimitStrategy_ALLOW_ALL},
		{map[string]string{"name": "free"}, typev3.RateLimitStrategy_ALLOW_ALL},
		{map[string]string{"name": "shadow"}, typev3.RateLimitStrategy_ALLOW_ALL},
		{map[string]string{"name": "blocked"}, typev3.RateLimitStrategy_DENY_ALL},
	} {
		if err := c.report(time.Millisecond, tc.id); err != nil {
			t.Fatal(err)
		}
		c.await(tc.id, tc.want.String(), func(a *rlqsv3.RateLimitQuotaResponse_BucketAction) bool {
			r, ok := blanket(a)
			return ok && r == tc.want
		})
	}
}

// Bad input ends the stream with a clear status and never a panic; huge
// reports count no more than the limit could have admitted.
func TestBadInput(t *testing.T) {
	t.Parallel()
	opts := fastOptions()
	opts.MaxBuckets = 3
	e := startEnforcer(t, opts)
	usage := func(id map[string]string) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
		return &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqsv3.BucketId{Bucket: id}, TimeElapsed: durationpb.New(time.Second)}
	}
	for _, tc := range []struct {
		name string
		msgs []*rlqsv3.RateLimitQuotaUsageReports
		code codes.Code
		msg  string
	}{
		{"no domain", []*rlqsv3.RateLimitQuotaUsageReports{{BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(checkout)}}},
			codes.InvalidArgument, "domain is required"},
		{"domain changed", []*rlqsv3.RateLimitQuotaUsageReports{
			{Domain: "edge", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(checkout)}},
			{Domain: "other", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(checkout)}}},
			codes.InvalidArgument, "domain changed"},
		{"no bucket id", []*rlqsv3.RateLimitQuotaUsageReports{{Domain: "edge", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{TimeElapsed: durationpb.New(time.Second)}}}},
			codes.InvalidArgument, "bucket_quota_usages[0]"},
		{"empty bucket id", []*rlqsv3.RateLimitQuotaUsageReports{{Domain: "edge", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{})}}},
			codes.InvalidArgument, "bucket_quota_usages[0]"},
		{"empty value", []*rlqsv3.RateLimitQuotaUsageReports{{Domain: "edge", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(checkout), usage(map[string]string{"name": ""})}}},
			codes.InvalidArgument, "bucket_quota_usages[1]"},
		{"key over the bounds", []*rlqsv3.RateLimitQuotaUsageReports{{Domain: "edge", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{strings.Repeat("k", 2000): "v"})}}},
			codes.InvalidArgument, "at most 1024"},
		{"too many buckets", []*rlqsv3.RateLimitQuotaUsageReports{{Domain: "edge", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			usage(map[string]string{"user": "1"}), usage(map[string]string{"user": "2"}), usage(map[string]string{"user": "3"}), usage(map[string]string{"user": "4"})}}},
			codes.ResourceExhausted, "at most 3"},
		{"too many over time", []*rlqsv3.RateLimitQuotaUsageReports{
			{Domain: "edge", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"user": "1"}), usage(map[string]string{"user": "2"})}},
			{Domain: "edge", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"user": "3"}), usage(map[string]string{"user": "4"})}}},
			codes.ResourceExhausted, "more than 3 buckets"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := e.connect(t)
			for _, m := range tc.msgs {
				if err := c.stream.Send(m); err != nil {
					break // the stream ended already
				}
			}
			code, msg := c.awaitEnd()
			if code != tc.code || !strings.Contains(msg, tc.msg) {
				t.Errorf("stream ended with %v %q, want %v containing %q", code, msg, tc.code, tc.msg)
			}
		})
	}

	t.Run("huge report", func(t *testing.T) {
		c := e.connect(t)
		c.admit(fast, math.MaxUint64)
		if err := c.report(time.Second, fast); err != nil {
			t.Fatal(err)
		}
		c.await(fast, "DENY_ALL", func(a *rlqsv3.RateLimitQuotaResponse_BucketAction) bool {
			r, ok := blanket(a)
			return ok && r == typev3.RateLimitStrategy_DENY_ALL
		})
		if s := e.check(t, "name", "fast"); s.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("RLS check after a huge report: %v, want OVER_LIMIT", s)
		}
		// Counted at most capacity + a second's refill: 5/s is back
		// within two seconds.
		deadline := time.Now().Add(3 * time.Second)
		for e.check(t, "name", "fast").GetCode() != rlsv3.RateLimitResponse_OK {
			if time.Now().After(deadline) {
				t.Fatal("the limit stayed blocked after a huge report")
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}
