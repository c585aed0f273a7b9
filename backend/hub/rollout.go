package hub

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/backend/store"
)

// Automatic halt of staged rollouts.
const (
	// haltLock is the advisory lock of the replica that watches rollouts
	// ("sluice" in ASCII, then 0x0019): one replica halts, never two.
	haltLock int64 = 0x736c756963650019
	// haltEvery is how often the staged rollout is judged.
	haltEvery = time.Second
	// haltLag is how many seconds behind now the judged seconds end: a
	// second's counts from the other replicas' nodes arrive within about
	// half a second of it ending (backend/stats).
	haltLag = 2
)

// watchRollouts runs, on the one replica holding haltLock, the automatic
// halt of the staged rollout until ctx ends.
func (h *Hub) watchRollouts(ctx context.Context) {
	if h.stats == nil {
		return
	}
	h.store.Lead(ctx, haltLock, 5*time.Second, func(ctx context.Context) {
		tick := time.NewTicker(haltEvery)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-tick.C:
				if err := h.judge(ctx, now); err != nil && ctx.Err() == nil {
					h.log.Warn("judge staged rollout", "error", err)
				}
			}
		}
	})
}

// judge halts the staged rollout if it has an automatic halt whose
// condition held in each of the last ForS complete seconds.
func (h *Hub) judge(ctx context.Context, now time.Time) error {
	ps, err := h.store.FindPushState(ctx)
	if err != nil {
		return err
	}
	r := ps.Staged
	if r == nil || r.AutoHalt == nil {
		return nil
	}
	v, err := h.store.FindVersion(ctx, r.Version)
	if err != nil {
		return err
	}
	last := now.Unix() - haltLag
	if last-int64(r.AutoHalt.ForS) < r.CreatedAt.Unix() {
		return nil // not staged long enough to judge
	}
	var why Verdict
	for t := last; t > last-int64(r.AutoHalt.ForS); t-- {
		canary, all := h.stats.Cohort(v.Domains, t)
		why = Judge(*r.AutoHalt, canary, all)
		if !why.Halt {
			return nil
		}
	}
	reason := fmt.Sprintf("automatic halt of version %d: the canary nodes (labelled %s) limited %.1f%% of requests (%.0f/s) against %.1f%% on the other nodes, over %gx for %d s",
		r.Version, r.LabelText(), 100*why.CanaryRate, why.CanaryLimitedPerS, 100*why.RestRate, r.AutoHalt.Factor, r.AutoHalt.ForS)
	nv, err := h.store.Halt(ctx, r.Version, reason)
	if err != nil {
		return err
	}
	h.log.Warn("halted staged rollout", "version", r.Version, "rollback_version", nv, "reason", reason)
	return h.Notify(ctx)
}

// Verdict is one second of a rollout judged.
type Verdict struct {
	Halt              bool
	CanaryRate        float64 // share of the canary's decisions that were limited
	RestRate          float64 // the same on the other nodes
	CanaryLimitedPerS float64
}

// Judge says whether one second's counts meet h's condition: the canary
// limited at least MinLimitedPerS, the other nodes made decisions too, and
// the canary's share of limited decisions is over Factor times theirs.
// Shadow-mode limits and store errors count in neither (they are no 429s).
func Judge(h store.AutoHalt, canary, all store.Counts) Verdict {
	cd := canary.Allowed + canary.Limited
	rd := all.Allowed + all.Limited - cd
	var v Verdict
	if cd <= 0 || rd <= 0 {
		return v // no traffic on one side: nothing to compare
	}
	v.CanaryRate = float64(canary.Limited) / float64(cd)
	v.RestRate = float64(all.Limited-canary.Limited) / float64(rd)
	v.CanaryLimitedPerS = float64(canary.Limited)
	v.Halt = v.CanaryLimitedPerS >= h.MinLimitedPerS && v.CanaryRate > h.Factor*v.RestRate
	return v
}
