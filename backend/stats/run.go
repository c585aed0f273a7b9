package stats

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/sluicehq/sluice/backend/store"
)

// Timing of the exchange between replicas.
const (
	// exchangeEvery is how often a replica writes its closed seconds and
	// reads the other replicas' frames.
	exchangeEvery = 200 * time.Millisecond
	// recentFrames is how far back a replica looks for frames it has not
	// read (a frame is read within exchangeEvery of being written; the
	// margin covers a slow database).
	recentFrames = 60 * time.Second
	// frameKeep is how long frames stay in Postgres: the window, for a
	// replica that starts, and a minute more.
	frameKeep = (WindowSeconds + 60) * time.Second
	// seenKeep is how long a replica remembers the ids of frames it read:
	// far longer than recentFrames, so that a difference between its clock
	// and the database's cannot make it read a frame twice.
	seenKeep = 5 * time.Minute
	// tickDelay is how long after a second ends its tick goes to the
	// browsers: time for the other replicas' frames of it to arrive.
	tickDelay = 600 * time.Millisecond
	// rollupDelay is how long after a minute ends it is rolled up.
	rollupDelay = 2 * time.Second
	// reloadEvery is how often settings, versions and spikes are re-read.
	reloadEvery = time.Second
)

// Load reads the settings and the domains of the latest version, and fills
// the series with every replica's frames of the window, so that a replica
// that starts answers for the fleet at once. Call it before the hub takes
// reports (a report naming a domain the aggregator does not know yet is
// refused); Run reloads the settings and versions every second anyway.
func (a *Aggregator) Load(ctx context.Context) error {
	if err := a.reload(ctx); err != nil {
		return err
	}
	return a.loadRecent(ctx)
}

// Run exchanges frames with the other replicas, writes rollups, feeds the
// streams, and (on the leading replica) finds spikes and sends alerts,
// until ctx ends; then it writes what its nodes counted one last time.
func (a *Aggregator) Run(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.st.Lead(ctx, leaderLock, 5*time.Second, a.lead)
	}()

	exchange := time.NewTicker(exchangeEvery)
	defer exchange.Stop()
	tick := time.NewTimer(untilTick(a.now()))
	defer tick.Stop()
	reload := time.NewTicker(reloadEvery)
	defer reload.Stop()
	retention := time.NewTicker(time.Minute)
	defer retention.Stop()
	failing := false
	var spikesSeen time.Time
	for {
		select {
		case <-ctx.Done():
			<-done
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			a.flush(fctx, true)
			a.flushPreview(fctx)
			return nil
		case <-exchange.C:
			err := a.exchange(ctx)
			switch {
			case err != nil && !failing && ctx.Err() == nil:
				a.log.Warn("exchange stats with the other replicas; will retry", "error", err)
				failing = true
			case err == nil && failing:
				a.log.Info("exchanging stats again")
				failing = false
			}
		case <-tick.C:
			now := a.now()
			a.tick(now.Unix() - 1)
			tick.Reset(untilTick(now))
		case <-reload.C:
			if err := a.reload(ctx); err != nil && ctx.Err() == nil {
				a.log.Debug("reload stats settings", "error", err)
			}
			spikesSeen = a.pollSpikes(ctx, spikesSeen)
			a.pollPromotions(ctx)
		case <-retention.C:
			a.prune(ctx)
		}
	}
}

// untilTick is the wait from now until the next tick: tickDelay past the
// next second.
func untilTick(now time.Time) time.Duration {
	next := now.Truncate(time.Second).Add(tickDelay)
	if !next.After(now) {
		next = next.Add(time.Second)
	}
	return next.Sub(now)
}

// loadRecent fills the series with every replica's frames of the window,
// so a replica that starts answers for the fleet at once.
func (a *Aggregator) loadRecent(ctx context.Context) error {
	frames, err := a.st.FramesSince(ctx, a.now().Unix()-WindowSeconds+1)
	if err != nil {
		return err
	}
	a.takeFrames(frames)
	return nil
}

// exchange writes this replica's closed seconds and reads the frames of
// the other replicas it has not read yet.
func (a *Aggregator) exchange(ctx context.Context) error {
	if err := a.flush(ctx, false); err != nil {
		return err
	}
	if err := a.flushPreview(ctx); err != nil {
		return err
	}
	ids, err := a.st.RecentFrameIDs(ctx, a.replica, recentFrames)
	if err != nil {
		return err
	}
	a.mu.Lock()
	unread := make([]int64, 0, len(ids))
	for _, id := range ids {
		if _, ok := a.seen[id]; !ok {
			unread = append(unread, id)
		}
	}
	a.mu.Unlock()
	frames, err := a.st.FindFrames(ctx, unread)
	if err != nil {
		return err
	}
	a.takeFrames(frames)
	return nil
}

// takeFrames adds to the series the frames not read yet and remembers
// them by when they were read, not by the second they count: a frame
// written late counts an old second but is listed while new. Ids too old
// to be listed again are forgotten.
func (a *Aggregator) takeFrames(frames []store.Frame) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	for _, f := range frames {
		if _, ok := a.seen[f.ID]; ok {
			continue
		}
		a.seen[f.ID] = now.Unix()
		a.applyFrameLocked(f)
	}
	oldest := now.Add(-seenKeep).Unix()
	maps.DeleteFunc(a.seen, func(_ int64, t int64) bool { return t < oldest })
}

// flush writes the closed seconds' frames and the closed minutes' rollups
// of this replica's nodes (all of them when final, at shutdown). What
// cannot be written stays pending for the next flush while it is still
// within the window.
func (a *Aggregator) flush(ctx context.Context, final bool) error {
	now := a.now()
	a.mu.Lock()
	cutoff := now.Unix()
	minuteCutoff := now.Add(-rollupDelay).Unix()
	minuteCutoff -= minuteCutoff % 60
	if final {
		cutoff, minuteCutoff = cutoff+1, now.Unix()+60
	}
	// Closed seconds and minutes still held by their series go to the
	// pending maps, then everything closed there is taken.
	for _, s := range a.series {
		o := &s.own
		if o.sec < cutoff && (!o.secC.Zero() || len(o.secTop) > 0) {
			a.spillSecond(o.sec, s.key, o.secC, o.secTop)
			a.spillCanary(o.sec, s.key, o.secCA, o.secCL)
			o.secC, o.secTop, o.secCA, o.secCL = store.Counts{}, nil, 0, 0
		}
		if o.min < minuteCutoff && !o.minC.Zero() {
			a.spillMinute(o.min, s.key, o.minC)
			a.spillValues(o.min, s.key, o.minC.Limited, o.minV)
			o.minC, o.minV = store.Counts{}, nil
		}
	}
	var frames []store.Frame
	for t, rules := range a.pending {
		if t >= cutoff {
			continue
		}
		delete(a.pending, t)
		if t <= now.Unix()-WindowSeconds {
			continue // too old to matter to anyone
		}
		f := store.Frame{T: t, Rules: make([]store.FrameRule, 0, len(rules))}
		for _, r := range rules {
			f.Rules = append(f.Rules, *r)
		}
		frames = append(frames, f)
	}
	var rollups []store.MinuteCounts
	for k, c := range a.minutes {
		if k.minute >= minuteCutoff {
			continue
		}
		delete(a.minutes, k)
		rollups = append(rollups, store.MinuteCounts{Minute: time.Unix(k.minute, 0).UTC(), RuleCounts: store.RuleCounts{RuleKey: k.RuleKey, Counts: c}})
	}
	a.mu.Unlock()

	slices.SortFunc(frames, func(x, y store.Frame) int { return int(x.T - y.T) })
	var ferr error
	if err := a.st.WriteFrames(ctx, a.replica, frames); err != nil {
		ferr = err
		a.mu.Lock()
		for _, f := range frames {
			for _, r := range f.Rules {
				a.spillSecond(f.T, store.RuleKey{Domain: r.Domain, Rule: r.Rule}, store.Counts{Allowed: r.A, Limited: r.L, ShadowLimited: r.S, StoreErrors: r.E}, r.Top)
				a.spillCanary(f.T, store.RuleKey{Domain: r.Domain, Rule: r.Rule}, r.CA, r.CL)
			}
		}
		a.mu.Unlock()
	}
	if err := a.st.AddMinutes(ctx, rollups); err != nil {
		a.mu.Lock()
		for _, r := range rollups {
			a.spillMinute(r.Minute.Unix(), r.RuleKey, r.Counts)
		}
		a.mu.Unlock()
		return err
	}
	if err := a.flushValues(ctx, minuteCutoff); err != nil {
		return err
	}
	return ferr
}

// prune applies retention to the tables (every minute: frames are large)
// and forgets series that have been empty for the whole window.
func (a *Aggregator) prune(ctx context.Context) {
	now := a.now()
	if _, err := a.st.DeleteFramesBefore(ctx, now.Add(-frameKeep)); err != nil {
		a.log.Warn("delete old stats frames", "error", err)
	}
	before := now.Add(-a.retention)
	if _, err := a.st.DeleteMinutesBefore(ctx, before); err != nil {
		a.log.Warn("delete old stats rollups", "error", err)
	}
	if _, err := a.st.DeleteValueMinutesBefore(ctx, now.Add(-a.valueRetention)); err != nil {
		a.log.Warn("delete old value rollups", "error", err)
	}
	if err := a.st.DeleteSpikesBefore(ctx, before); err != nil {
		a.log.Warn("delete old spikes", "error", err)
	}
	if err := a.st.DeleteDeliveriesBefore(ctx, before); err != nil {
		a.log.Warn("delete old alert deliveries", "error", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	oldest := now.Unix() - WindowSeconds
	a.pruneCanaryLocked(oldest)
	maps.DeleteFunc(a.series, func(_ store.RuleKey, s *series) bool {
		for i := range s.slots {
			if s.slots[i].t > oldest {
				return false
			}
		}
		return true
	})
}
