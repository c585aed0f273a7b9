package stats

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules/wire"
)

// Cohorts of a staged rollout. The hub tells which reports come from
// canary nodes (those running the staged version, IngestCanary); each rule
// then keeps, beside its counts, the canary's share of its allowed and
// limited decisions, for the same window and exchanged between replicas in
// the same frames (FrameRule.CA, CL), so every replica knows it for the
// whole fleet. The rest is the fleet minus the canary. Only rules a canary
// reported hold the extra ring (16 bytes a second); there is none when no
// rollout is staged. Cohorts are not rolled up: they cover the live window.

// canarySeries is one rule's canary share, a ring like series'.
type canarySeries struct {
	slots [WindowSeconds]canarySlot
}

type canarySlot struct{ t, allowed, limited int64 }

// IngestCanary is Ingest for a report from a node that runs a staged
// rollout's version: it also counts in the canary cohort.
func (a *Aggregator) IngestCanary(m *wire.Stats, at time.Time) error {
	return a.ingestAs(m, at, true)
}

// addCanaryLocked adds to rule k's canary share of second t; caller holds
// a.mu.
func (a *Aggregator) addCanaryLocked(k store.RuleKey, t, allowed, limited int64) {
	now := a.now().Unix()
	if t <= now-WindowSeconds || t > now+5 {
		return
	}
	if a.canary == nil {
		a.canary = make(map[store.RuleKey]*canarySeries)
	}
	cs := a.canary[k]
	if cs == nil {
		if a.series[k] == nil {
			return // the rule is not tracked (MaxSeries)
		}
		cs = &canarySeries{}
		a.canary[k] = cs
	}
	sl := &cs.slots[t%WindowSeconds]
	if sl.t != t {
		*sl = canarySlot{t: t}
	}
	sl.allowed += allowed
	sl.limited += limited
}

// spillCanary adds a canary share to the pending frame of second t (after
// spillSecond made its rule's entry); caller holds a.mu.
func (a *Aggregator) spillCanary(t int64, k store.RuleKey, allowed, limited int64) {
	if allowed == 0 && limited == 0 {
		return
	}
	if fr := a.pending[t][k]; fr != nil {
		fr.CA += allowed
		fr.CL += limited
	}
}

// pruneCanaryLocked forgets canary rings with nothing newer than oldest.
func (a *Aggregator) pruneCanaryLocked(oldest int64) {
	maps.DeleteFunc(a.canary, func(_ store.RuleKey, cs *canarySeries) bool {
		for i := range cs.slots {
			if cs.slots[i].t > oldest {
				return false
			}
		}
		return true
	})
}

// Cohort returns the canary cohort's and the whole fleet's allowed and
// limited decisions in second t, summed over the rules of domains.
func (a *Aggregator) Cohort(domains []string, t int64) (canary, all store.Counts) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cohortLocked(domains, t)
}

func (a *Aggregator) cohortLocked(domains []string, t int64) (canary, all store.Counts) {
	for k, s := range a.series {
		if !slices.Contains(domains, k.Domain) {
			continue
		}
		c, _ := s.get(t)
		all.Allowed += c.Allowed
		all.Limited += c.Limited
		if cs := a.canary[k]; cs != nil {
			if sl := cs.slots[t%WindowSeconds]; sl.t == t {
				canary.Allowed += sl.allowed
				canary.Limited += sl.limited
			}
		}
	}
	return canary, all
}

// CohortPoint is one second of a rollout's cohorts: the canary nodes' and
// the other nodes' allowed and limited decisions.
type CohortPoint struct {
	T             int64 `json:"t"`
	CanaryAllowed int64 `json:"canary_allowed"`
	CanaryLimited int64 `json:"canary_limited"`
	RestAllowed   int64 `json:"rest_allowed"`
	RestLimited   int64 `json:"rest_limited"`
}

// Cohorts returns the seconds from..to (within the live window) with
// decisions, over the rules of domains.
func (a *Aggregator) Cohorts(domains []string, from, to int64) []CohortPoint {
	now := a.now().Unix()
	from, to = max(from, now-WindowSeconds+1), min(to, now-1)
	out := []CohortPoint{}
	a.mu.Lock()
	defer a.mu.Unlock()
	for t := from; t <= to; t++ {
		c, all := a.cohortLocked(domains, t)
		if all.Allowed == 0 && all.Limited == 0 {
			continue
		}
		out = append(out, CohortPoint{T: t, CanaryAllowed: c.Allowed, CanaryLimited: c.Limited,
			RestAllowed: all.Allowed - c.Allowed, RestLimited: all.Limited - c.Limited})
	}
	return out
}

// withPromotions adds the promotes of domain ("" for all) in [from, to) to
// markers, in time order.
func (a *Aggregator) withPromotions(ctx context.Context, markers []Marker, domain string, from, to time.Time) ([]Marker, error) {
	ps, err := a.st.ListPromotions(ctx, domain, from, to)
	if err != nil || len(ps) == 0 {
		return markers, err
	}
	for _, p := range ps {
		markers = append(markers, promoteMarker(p))
	}
	slices.SortStableFunc(markers, func(x, y Marker) int { return int(x.T - y.T) })
	return markers, nil
}

func promoteMarker(p store.Promotion) Marker {
	return Marker{T: p.At.Unix(), Version: p.Version, Kind: "promote", Author: p.By, Message: p.Message, Domains: p.Domains}
}

// pollPromotions sends a marker to the streams for each promote since the
// last poll (by any replica).
func (a *Aggregator) pollPromotions(ctx context.Context) {
	a.mu.Lock()
	since := a.promoted
	a.mu.Unlock()
	now := a.now()
	if since.IsZero() {
		since = now.Add(-2 * reloadEvery)
	}
	ps, err := a.st.ListPromotions(ctx, "", since, now.Add(time.Hour))
	if err != nil || len(ps) == 0 {
		a.mu.Lock()
		if a.promoted.IsZero() {
			a.promoted = since
		}
		a.mu.Unlock()
		return
	}
	a.mu.Lock()
	a.promoted = ps[len(ps)-1].At.Add(time.Microsecond)
	a.mu.Unlock()
	for _, p := range ps {
		m := promoteMarker(p)
		a.broadcast(func(s *Subscription) any {
			if s.domain != "" && !slices.Contains(m.Domains, s.domain) {
				return nil
			}
			return markerMessage{Type: "marker", Marker: m}
		})
	}
}
