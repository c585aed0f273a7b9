package engine

import (
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/wire"
)

// Quota usage for billing
//
// A quota is a fixed_window limit with calendar windows (calendar: true,
// unit day, week, month or year). For each one, the engine records the
// hits it admitted per descriptor value and calendar period, and TakeQuota
// hands them to the subscriber, which sends them to the console in
// wire.Quota batches. What is recorded is exactly what the counter store
// counted: the hits of a request the whole check admitted (a shadow-mode
// limit's only when it was not over), including those the in-process
// limiter admitted for a failure_mode: local limit while Redis was down.
// Requests admitted with no counter at all (failure_mode: open while the
// store is down) are not recorded; they count as store_errors in the stats.
// WithoutStats turns the recording off with the stats.
//
// The period comes from the store's clock, never from the node's: a
// fixed_window decision's ResetAfter is the time from the store's now
// (Redis TIME in the script) to the end of the window it counted in, so
// the node's clock plus ResetAfter estimates that end within the node's
// clock skew and the round trip, and the nearest calendar boundary of the
// unit is that end exactly while the skew is under 12 hours (windows are
// at least a day long). The period is then the window that ends there. On a
// Redis Cluster Take spanning several slots every slot decides at one time
// (the limiter's shared clock), so the window recorded is the one counted.
//
// The value is the limit's counter value (the request's, or the shared
// wildcard of a share_threshold level): the entry's value for a one-entry
// descriptor, "key=value" pairs joined by ", " otherwise, through
// wire.Value: a value longer than wire.MaxQuotaValueBytes, or holding NUL
// or invalid UTF-8, is recorded as its first bytes (cleaned), "…" and 16
// hex digits of its SHA-256, so distinct values stay distinct and the
// console can store every one.
//
// Bounds: the engine holds at most QuotaMaxEntries distinct (limit, value,
// period) entries not yet taken; from QuotaSoftEntries on it signals
// QuotaFull so that the subscriber sends early. While the console cannot
// take them and the bound is reached, hits of new entries are not recorded
// but counted and reported as wire.Quota.Dropped (hits of entries already
// held are still added). An entry costs about 100 bytes plus its value.
const (
	QuotaSoftEntries = 10_000
	QuotaMaxEntries  = 100_000
)

type quotaKey struct {
	domain, rule string
	unit         rules.Unit
	value        string
	start        int64 // Unix seconds
}

type quotaEntry struct{ hits, limit int64 }

// quotas records quota usage; the zero value is ready.
type quotas struct {
	mu      sync.Mutex
	m       map[quotaKey]quotaEntry
	dropped int64
	full    chan struct{} // made by New; signalled from QuotaSoftEntries on
	now     func() time.Time
}

// WithQuotaClock replaces the node's clock in the period estimate (see
// TakeQuota) with now: tests that inject the store's time inject the same
// here. The store's time still decides the period; now only picks the
// boundary.
func WithQuotaClock(now func() time.Time) Option { return func(e *Engine) { e.quota.now = now } }

// isQuota reports whether l is a quota (rules.Limit.Quota).
func isQuota(l *rules.Limit) bool { return l != nil && l.Quota() }

// count records the admitted hits of the quotas of a decided check.
func (q *quotas) count(req *Request, res *Result) {
	if res.Code != OK {
		return
	}
	var now time.Time
	for i, s := range res.Statuses {
		l := s.Limit
		if !isQuota(l) || s.Code != OK || s.Shadowed || !s.Limited() || s.ResetAfter <= 0 {
			continue
		}
		h := int64(1)
		if req.Hits > 0 {
			h = clampHits(req.Hits)
		}
		if d := req.Descriptors[i]; d.Hits != nil {
			h = clampHits(*d.Hits)
		}
		if h <= 0 {
			continue
		}
		if now.IsZero() {
			if q.now != nil {
				now = q.now()
			} else {
				now = time.Now()
			}
		}
		end := l.Unit.NearestWindowEnd(now.Add(s.ResetAfter))
		start, _ := l.Unit.Window(end.Add(-time.Nanosecond))
		domain := l.Domain
		if domain == "" {
			domain = req.Domain
		}
		q.add(quotaKey{domain: domain, rule: l.Name, unit: l.Unit, start: start.Unix(),
			value: quotaValue(l.CounterEntries(req.Descriptors[i].Entries, nil))}, h, int64(l.RequestsPerUnit))
	}
}

func (q *quotas) add(k quotaKey, hits, limit int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	e, ok := q.m[k]
	if !ok {
		if len(q.m) >= QuotaMaxEntries {
			q.dropped += hits
			return
		}
		if q.m == nil {
			q.m = make(map[quotaKey]quotaEntry)
		}
		if len(q.m)+1 >= QuotaSoftEntries && q.full != nil {
			select {
			case q.full <- struct{}{}:
			default:
			}
		}
	}
	e.hits += hits
	e.limit = limit
	q.m[k] = e
}

// quotaValue names a counter value in quota usage (see the bounds above).
func quotaValue(entries []rules.Entry) string {
	var v string
	if len(entries) == 1 {
		v = entries[0].Value
	} else {
		var b strings.Builder
		for i, e := range entries {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(e.Key)
			b.WriteByte('=')
			b.WriteString(e.Value)
		}
		v = b.String()
	}
	return wire.Value(v)
}

// TakeQuota removes and returns up to limit recorded quota usage entries
// (all of them when limit <= 0), the hits dropped since its previous call
// (see the bounds in quota.go) and whether entries remain. It is the
// enforcer's subscriber.QuotaSource. The hits of an entry are those
// admitted since the entry was last taken.
func (e *Engine) TakeQuota(limit int) (usage []wire.QuotaUsage, dropped int64, more bool) {
	q := &e.quota
	q.mu.Lock()
	defer q.mu.Unlock()
	n := len(q.m)
	if limit > 0 {
		n = min(n, limit)
	}
	usage = make([]wire.QuotaUsage, 0, n)
	for k, v := range q.m {
		if len(usage) == n {
			break
		}
		usage = append(usage, wire.QuotaUsage{Domain: k.domain, Rule: k.rule, Unit: string(k.unit), Value: k.value,
			Start: k.start, Hits: v.hits, Limit: v.limit})
		delete(q.m, k)
	}
	dropped, q.dropped = q.dropped, 0
	return usage, dropped, len(q.m) > 0
}

// QuotaFull is signalled when the recorded quota usage reaches
// QuotaSoftEntries entries, so that the subscriber sends it early.
func (e *Engine) QuotaFull() <-chan struct{} { return e.quota.full }
