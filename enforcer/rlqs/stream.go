package rlqs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/rules"
)

// maxActionsPerResponse bounds one response message (about 100 bytes an
// action): a stream's buckets may need several.
const maxActionsPerResponse = 1000

// stream is one client's RLQS stream. Only its run goroutine touches it.
type stream struct {
	srv     *Server
	gs      grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]
	id      string // names the client in presence members
	domain  string
	version int64 // ruleset version the buckets were resolved in
	buckets map[string]*bucket
	failing bool // the store failed on the last report (logged once)
}

// bucket is one bucket a client reports.
type bucket struct {
	id      *rlqsv3.BucketId // as the client sent it, echoed in actions
	entries []rules.Entry    // the id's pairs, in key order
	b       engine.Bucket
	member  limiter.Presence // Key "" without a counter

	last time.Time       // last report of it
	gaps []time.Duration // the last intervals between reports, at most 4
	ttl  time.Duration

	clients   int64 // sharing the counter, this one included; 0 unknown
	remaining int64 // the counter's, last read
	known     bool  // remaining was read

	sent    assignment
	sentAt  time.Time
	hasSent bool
}

type kind int

const (
	allowAll kind = iota + 1
	denyAll
	tokenBucket
)

// assignment is a strategy sent to a client for one bucket.
type assignment struct {
	kind      kind
	maxTokens int64
	clients   int64
	perFill   int64
	period    time.Duration
}

func (st *stream) run(ctx context.Context) error {
	msgs := make(chan *rlqsv3.RateLimitQuotaUsageReports)
	errc := make(chan error, 1)
	go func() {
		for {
			m, err := st.gs.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	tick := time.NewTicker(st.srv.opts.Refresh)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-st.srv.ctx.Done():
			return status.Error(codes.Unavailable, "enforcer shutting down")
		case err := <-errc:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case m := <-msgs:
			if err := st.report(ctx, m); err != nil {
				return err
			}
		case <-tick.C:
			if err := st.refresh(ctx); err != nil {
				return err
			}
		}
	}
}

// report handles one usage report: counts it, refreshes the client's
// presence in its buckets and sends what changed.
func (st *stream) report(ctx context.Context, m *rlqsv3.RateLimitQuotaUsageReports) error {
	switch d := m.GetDomain(); {
	case d != "" && st.domain == "":
		st.domain = d
		st.version = st.srv.eng.Version()
	case d != "" && d != st.domain:
		return status.Errorf(codes.InvalidArgument, "domain changed from %q to %q: a stream serves one domain, open another", st.domain, d)
	case st.domain == "":
		return status.Error(codes.InvalidArgument, "domain is required in the first report")
	}
	usages := m.GetBucketQuotaUsages()
	if len(usages) > st.srv.opts.MaxBuckets {
		return status.Errorf(codes.ResourceExhausted, "%d buckets in one report, at most %d allowed", len(usages), st.srv.opts.MaxBuckets)
	}
	if len(usages) == 0 {
		return nil
	}
	now := time.Now()
	usage := make([]engine.Usage, 0, len(usages))
	touched := make([]*bucket, 0, len(usages))
	of := make([]*bucket, 0, len(usages)) // the bucket of each usage
	for i, u := range usages {
		if err := u.Validate(); err != nil {
			return status.Errorf(codes.InvalidArgument, "bucket_quota_usages[%d]: %v", i, err)
		}
		canon, entries := canonical(u.GetBucketId().GetBucket())
		bk := st.buckets[canon]
		if bk == nil {
			if len(st.buckets) >= st.srv.opts.MaxBuckets {
				return status.Errorf(codes.ResourceExhausted, "more than %d buckets on one stream", st.srv.opts.MaxBuckets)
			}
			bk = &bucket{id: u.GetBucketId(), entries: entries}
			bk.member.Member = st.id + "|" + memberHash(canon)
			if err := st.resolve(ctx, bk); err != nil {
				return bucketError(i, err)
			}
			st.buckets[canon] = bk
		} else if bk.b.Version != st.srv.eng.Version() {
			if err := st.resolve(ctx, bk); err != nil {
				return bucketError(i, err)
			}
		}
		bk.observe(now, u.GetTimeElapsed().AsDuration(), st.srv.opts.MinClientTTL)
		of = append(of, bk)
		usage = append(usage, engine.Usage{Bucket: bk.b, Allowed: u.GetNumRequestsAllowed(), Denied: u.GetNumRequestsDenied(), Elapsed: u.GetTimeElapsed().AsDuration()})
		if !slices.Contains(touched, bk) {
			touched = append(touched, bk)
		}
	}
	// Counting and joining are independent Redis calls: one round trip
	// for both. (join sets only the buckets' client counts.)
	joined := make(chan struct{})
	go func() {
		defer close(joined)
		st.join(ctx, touched)
	}()
	states, err := st.srv.eng.Report(ctx, usage)
	<-joined
	st.storeResult(len(usage), err)
	if err == nil {
		for i, u := range usage {
			if u.Bucket.Counted() {
				of[i].remaining, of[i].known = states[i].Remaining, true
			}
		}
	}
	return st.send(now, touched, nil)
}

// bucketError maps an error resolving usage i's bucket to a status.
func bucketError(i int, err error) error {
	if errors.Is(err, engine.ErrNoRuleset) {
		return status.Error(codes.Unavailable, "no ruleset loaded yet")
	}
	return status.Errorf(codes.InvalidArgument, "bucket_quota_usages[%d]: %v", i, err)
}

// storeResult records the outcome of counting n usages.
func (st *stream) storeResult(n int, err error) {
	if err == nil {
		st.srv.reports.WithLabelValues("counted").Add(float64(n))
		if st.failing {
			st.failing = false
			st.srv.log.Info("rlqs: counting usage reports again", "stream", st.id)
		}
		return
	}
	st.srv.reports.WithLabelValues("store_error").Add(float64(n))
	if !st.failing {
		st.failing = true
		st.srv.log.Warn("rlqs: usage reports not counted: counter store failed", "stream", st.id, "domain", st.domain, "error", err)
	}
}

// resolve (re)resolves bk in the applied ruleset, moving its presence to
// its counter's set.
func (st *stream) resolve(ctx context.Context, bk *bucket) error {
	b, err := st.srv.eng.Bucket(st.domain, bk.entries)
	if err != nil {
		return err
	}
	key := ""
	if b.Counted() {
		key = b.Key() + ":rlqs"
	}
	if bk.member.Key != "" && bk.member.Key != key {
		st.leave(ctx, []limiter.Presence{bk.member})
	}
	if bk.b.Limit != b.Limit || bk.member.Key != key {
		bk.clients, bk.known = 0, false
	}
	bk.b, bk.member.Key = b, key
	return nil
}

// observe records a report of bk at now and recomputes its TTL.
func (bk *bucket) observe(now time.Time, elapsed, minTTL time.Duration) {
	gap := elapsed
	if !bk.last.IsZero() {
		gap = max(gap, now.Sub(bk.last))
	}
	bk.last = now
	if gap > 0 {
		bk.gaps = append(bk.gaps, gap)
		if len(bk.gaps) > 4 {
			bk.gaps = bk.gaps[1:]
		}
	}
	longest := time.Duration(0)
	for _, g := range bk.gaps {
		longest = max(longest, g)
	}
	bk.ttl = min(max(minTTL, 3*longest), MaxClientTTL)
	bk.member.TTL = bk.ttl
}

// join refreshes the client's presence in bks' counters and reads their
// client counts. On a store error the counts stay as they were.
func (st *stream) join(ctx context.Context, bks []*bucket) {
	var (
		ps  []limiter.Presence
		idx []*bucket
	)
	for _, bk := range bks {
		if bk.member.Key != "" {
			ps = append(ps, bk.member)
			idx = append(idx, bk)
		}
	}
	if len(ps) == 0 {
		return
	}
	ns, err := st.srv.presence.Join(ctx, ps)
	if err != nil {
		return
	}
	for i, bk := range idx {
		bk.clients = max(ns[i], 1)
	}
}

// leave removes the client from ps, within a second even when the stream's
// context has ended. A failure leaves the members to expire.
func (st *stream) leave(ctx context.Context, ps []limiter.Presence) {
	if len(ps) == 0 {
		return
	}
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_, _ = st.srv.presence.Leave(lctx, ps)
}

// leaveAll removes the client from every bucket's presence set.
func (st *stream) leaveAll() {
	var ps []limiter.Presence
	for _, bk := range st.buckets {
		if bk.member.Key != "" {
			ps = append(ps, bk.member)
		}
	}
	st.leave(context.Background(), ps)
}

// refresh runs every Refresh: re-resolves the buckets after a ruleset
// change, abandons the buckets the client stopped reporting, re-reads the
// shares and the counters of throttled buckets, and sends what changed.
func (st *stream) refresh(ctx context.Context) error {
	if st.domain == "" {
		return nil
	}
	now := time.Now()
	if v := st.srv.eng.Version(); v != st.version {
		st.version = v
		for _, bk := range st.buckets {
			if err := st.resolve(ctx, bk); err != nil {
				return status.Errorf(codes.Unavailable, "resolve buckets in version %d: %v", v, err)
			}
		}
	}
	var (
		abandoned []*rlqsv3.BucketId
		gone      []limiter.Presence
		live      = make([]*bucket, 0, len(st.buckets))
	)
	for canon, bk := range st.buckets {
		if now.Sub(bk.last) > bk.ttl {
			delete(st.buckets, canon)
			abandoned = append(abandoned, bk.id)
			if bk.member.Key != "" {
				gone = append(gone, bk.member)
			}
			continue
		}
		live = append(live, bk)
	}
	st.leave(ctx, gone)

	var (
		ps      []limiter.Presence
		counted []*bucket
		reads   []engine.Usage
		readBks []*bucket
	)
	for _, bk := range live {
		if bk.member.Key == "" {
			continue
		}
		ps = append(ps, bk.member)
		counted = append(counted, bk)
		if bk.throttled() {
			reads = append(reads, engine.Usage{Bucket: bk.b})
			readBks = append(readBks, bk)
		}
	}
	if len(ps) > 0 {
		if ns, err := st.srv.presence.Members(ctx, ps); err == nil {
			for i, bk := range counted {
				bk.clients = max(ns[i], 1)
			}
		}
	}
	if len(reads) > 0 {
		if states, err := st.srv.eng.Report(ctx, reads); err == nil {
			for i, bk := range readBks {
				bk.remaining, bk.known = states[i].Remaining, true
			}
		}
	}
	return st.send(now, live, abandoned)
}

// throttled reports whether bk's last assignment holds less than its share
// because the counter held less: its counter is then read every Refresh.
func (bk *bucket) throttled() bool {
	if !bk.hasSent || !bk.b.Counted() {
		return false
	}
	switch bk.sent.kind {
	case denyAll:
		return true
	case tokenBucket:
		return bk.sent.maxTokens < bk.full(max(bk.clients, 1))
	}
	return false
}

// full is a client's share of bk's capacity among n clients.
func (bk *bucket) full(n int64) int64 { return max(1, bk.b.Capacity()/n) }

// assign computes bk's assignment (see the package doc).
func (bk *bucket) assign() assignment {
	l := bk.b.Limit
	switch {
	case l == nil || l.Unlimited || l.ShadowMode || !bk.b.Counted() && !l.BlocksAll():
		return assignment{kind: allowAll}
	case l.BlocksAll():
		return assignment{kind: denyAll}
	case bk.known && bk.remaining <= 0:
		return assignment{kind: denyAll}
	}
	n := max(bk.clients, 1)
	full := bk.full(n)
	m := full
	if bk.known {
		m = min(full, max(1, bk.remaining/n))
	}
	a := assignment{kind: tokenBucket, maxTokens: m, clients: n, perFill: int64(l.RequestsPerUnit), period: l.Period}
	if p := bk.sent; bk.hasSent && p.kind == tokenBucket && p.clients == n && p.perFill == a.perFill && p.period == a.period &&
		p.maxTokens <= full && m < full && m < 2*p.maxTokens {
		// Keep the depth sent until the share has doubled or is whole:
		// each new strategy is a new bucket in Envoy.
		a.maxTokens = p.maxTokens
	}
	return a
}

// send sends the assignments of bks that changed or are due to be
// extended, and abandons abandoned.
func (st *stream) send(now time.Time, bks []*bucket, abandoned []*rlqsv3.BucketId) error {
	ttl := st.srv.opts.AssignmentTTL
	var actions []*rlqsv3.RateLimitQuotaResponse_BucketAction
	for _, bk := range bks {
		a := bk.assign()
		if bk.hasSent && a == bk.sent && now.Sub(bk.sentAt) < ttl/2 {
			continue
		}
		bk.sent, bk.sentAt, bk.hasSent = a, now, true
		actions = append(actions, &rlqsv3.RateLimitQuotaResponse_BucketAction{
			BucketId: bk.id,
			BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
				QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
					AssignmentTimeToLive: durationpb.New(ttl),
					RateLimitStrategy:    a.strategy(),
				},
			},
		})
	}
	for _, id := range abandoned {
		actions = append(actions, &rlqsv3.RateLimitQuotaResponse_BucketAction{
			BucketId:     id,
			BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}},
		})
	}
	for len(actions) > 0 {
		n := min(len(actions), maxActionsPerResponse)
		if err := st.gs.Send(&rlqsv3.RateLimitQuotaResponse{BucketAction: actions[:n]}); err != nil {
			return err
		}
		actions = actions[n:]
	}
	return nil
}

// strategy is a's RateLimitStrategy. The token bucket's fill interval is
// the limit's period times the clients, so their buckets together refill
// at the limit's rate; where that product would overflow a duration the
// tokens per fill are divided instead (rounded up, at least 1).
func (a assignment) strategy() *typev3.RateLimitStrategy {
	switch a.kind {
	case denyAll:
		return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}
	case tokenBucket:
	default:
		return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_ALLOW_ALL}}
	}
	perFill, interval := a.perFill, a.period
	if a.clients > 1 {
		if a.period <= time.Duration(math.MaxInt64/a.clients) {
			interval = a.period * time.Duration(a.clients)
		} else {
			perFill = limiter.Share(perFill, a.clients)
		}
	}
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     uint32(min(a.maxTokens, math.MaxUint32)),
		TokensPerFill: wrapperspb.UInt32(uint32(min(max(perFill, 1), math.MaxUint32))),
		FillInterval:  durationpb.New(interval),
	}}}
}

// canonical returns a bucket id's identity (its pairs in key order, each
// length-prefixed, so distinct ids never share one) and its entries in key
// order.
func canonical(id map[string]string) (string, []rules.Entry) {
	entries := make([]rules.Entry, 0, len(id))
	for k, v := range id {
		entries = append(entries, rules.Entry{Key: k, Value: v})
	}
	slices.SortFunc(entries, func(a, b rules.Entry) int { return strings.Compare(a.Key, b.Key) })
	var b strings.Builder
	for _, e := range entries {
		b.WriteString(strconv.Itoa(len(e.Key)))
		b.WriteByte(':')
		b.WriteString(e.Key)
		b.WriteString(strconv.Itoa(len(e.Value)))
		b.WriteByte(':')
		b.WriteString(e.Value)
	}
	return b.String(), entries
}

// memberHash names a bucket id in a presence member, shortly.
func memberHash(canon string) string {
	sum := sha256.Sum256([]byte(canon))
	return hex.EncodeToString(sum[:8])
}
