package stats

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/sluicehq/sluice/backend/store"
)

// Spike detection. For each rule, every second, the leader compares the
// rule's 429s in that second (v) with its baseline b, an exponentially
// weighted moving average of v with a time constant of baselineTau:
//
//   - during the first warm-up seconds of a rule (Config.SpikeWarmup) b is
//     the plain mean of v and nothing fires, so traffic that starts
//     steady — including a limit that admits its burst, then rejects — is
//     its own baseline;
//   - a spike starts when v > max(floor, factor·b) for for_s seconds in a
//     row (b stays as it was while v is above), and ends when v falls back
//     to at most that threshold for for_s seconds in a row;
//   - defaults floor 5/s, factor 5, for_s 3: a 10× jump over steady
//     limiting fires, steady limiting (even noisy by less than 5×) never
//     does, and nothing under 5 429/s ever does.
//
// The leader looks detectLag seconds behind the clock, so the other
// replicas' frames of a second are in before it is judged.
const (
	baselineTau = 60.0 // seconds
	detectLag   = 3
	// DefaultSpikeWarmup is a rule's warm-up when Config.SpikeWarmup is zero.
	DefaultSpikeWarmup = 10 * time.Second
	// leaderLock is the advisory lock the leading replica holds ("sluice"
	// and 1).
	leaderLock int64 = 0x736c756963650001
)

// Alert events.
const (
	EventSpikeStart = "spike.start"
	EventSpikeEnd   = "spike.end"
	EventTest       = "alert.test"
)

// Delivery retries: attempt n+1 waits 2^n seconds (at most maxBackoff);
// after maxAttempts a delivery has failed.
const (
	maxAttempts = 8
	maxBackoff  = 5 * time.Minute
)

// ruleState is one rule's detector state.
type ruleState struct {
	seen         int // seconds observed, up to the warm-up
	baseline     float64
	above, below int
	open         bool
	id           int64 // the open spike's row (0: not written yet)
	start        int64
	peak         float64
	startBase    float64
}

// detector finds spikes; it is the leader's alone.
type detector struct {
	warmup int
	rules  map[store.RuleKey]*ruleState
}

// event is a spike starting or ending.
type event struct {
	key   store.RuleKey
	start bool
	st    *ruleState
	t     int64 // the spike's start, or the second it ended
}

// observe judges second t's value v of rule k.
func (d *detector) observe(k store.RuleKey, v float64, s store.SpikeSettings, t int64) *event {
	st := d.rules[k]
	if st == nil {
		st = &ruleState{}
		d.rules[k] = st
	}
	if st.seen < d.warmup {
		st.seen++
		st.baseline += (v - st.baseline) / float64(st.seen)
		return nil
	}
	threshold := math.Max(s.FloorPerS, s.Factor*st.baseline)
	forS := max(s.ForS, 1)
	if !st.open {
		if v > threshold {
			st.above++
			st.peak = math.Max(st.peak, v)
			if st.above >= forS {
				st.open, st.below, st.id = true, 0, 0
				st.start, st.startBase = t-int64(forS)+1, st.baseline
				return &event{key: k, start: true, st: st, t: st.start}
			}
			return nil
		}
		st.above, st.peak = 0, 0
		st.baseline += (v - st.baseline) * (1 - math.Exp(-1/baselineTau))
		return nil
	}
	st.peak = math.Max(st.peak, v)
	if v > threshold {
		st.below = 0
		return nil
	}
	st.below++
	if st.below < forS {
		return nil
	}
	st.open, st.above = false, 0
	ev := &event{key: k, st: st, t: t - int64(forS) + 1}
	return ev
}

// lead runs spike detection and alert delivery while this replica leads.
func (a *Aggregator) lead(ctx context.Context) {
	a.log.Info("this console replica finds spikes and sends alerts")
	d := &detector{warmup: int(a.warmup / time.Second), rules: make(map[store.RuleKey]*ruleState)}
	go a.deliverLoop(ctx)

	// Warm up on the window the replica holds, then take over the spikes
	// the previous leader left open.
	next := a.now().Unix() - WindowSeconds + 1
	upto := a.now().Unix() - detectLag
	for ; next <= upto; next++ {
		a.detect(ctx, d, next, false)
	}
	a.adopt(ctx, d)

	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for upto := a.now().Unix() - detectLag; next <= upto; next++ {
			a.detect(ctx, d, next, true)
		}
	}
}

// detect judges second t for every rule; write records what starts and
// ends (false while warming up on the past).
func (a *Aggregator) detect(ctx context.Context, d *detector, t int64, write bool) {
	a.mu.Lock()
	cfg := withDefaults(a.config)
	values := make(map[store.RuleKey]float64, len(a.series))
	for k, s := range a.series {
		c, _ := s.get(t)
		values[k] = float64(c.Limited)
	}
	a.mu.Unlock()
	for k, v := range values {
		ev := d.observe(k, v, spikeSettings(cfg, k.Domain), t)
		switch {
		case ev != nil && write:
			a.record(ctx, cfg, ev)
		case write && d.rules[k].open && d.rules[k].id != 0 && v >= d.rules[k].peak && v > 0:
			if err := a.st.UpdateSpikePeak(ctx, d.rules[k].id, v); err != nil {
				a.log.Warn("raise spike peak", "error", err)
			}
		}
	}
}

// record writes a spike's start or end with its alerts.
func (a *Aggregator) record(ctx context.Context, cfg store.AlertConfig, ev *event) {
	st := ev.st
	if ev.start {
		sp := store.Spike{Domain: ev.key.Domain, Rule: ev.key.Rule, Start: time.Unix(st.start, 0),
			PeakLimitedPerS: st.peak, BaselinePerS: st.startBase}
		saved, err := a.st.OpenSpike(ctx, sp, a.deliveries(cfg, EventSpikeStart, sp))
		if err != nil {
			a.log.Warn("record spike", "domain", sp.Domain, "rule", sp.Rule, "error", err)
			return
		}
		st.id = saved.ID
		a.log.Info("spike of 429s started", "domain", sp.Domain, "rule", sp.Rule, "limited_per_s", st.peak, "baseline_per_s", st.startBase)
		return
	}
	if st.id == 0 {
		return // its start was never written
	}
	end := time.Unix(ev.t, 0)
	sp := store.Spike{ID: st.id, Domain: ev.key.Domain, Rule: ev.key.Rule, Start: time.Unix(st.start, 0), End: &end,
		PeakLimitedPerS: st.peak, BaselinePerS: st.startBase}
	if err := a.st.CloseSpike(ctx, st.id, end, st.peak, a.deliveries(cfg, EventSpikeEnd, sp)); err != nil {
		a.log.Warn("close spike", "domain", sp.Domain, "rule", sp.Rule, "error", err)
		return
	}
	a.log.Info("spike of 429s ended", "domain", sp.Domain, "rule", sp.Rule, "peak_limited_per_s", st.peak)
	st.id, st.peak = 0, 0
}

// adopt reconciles the detector, just warmed up, with the spikes Postgres
// says are open: one still going on is taken over, one that is over is
// closed, and one the detector sees that no row has is recorded.
func (a *Aggregator) adopt(ctx context.Context, d *detector) {
	open, err := a.st.OpenSpikes(ctx)
	if err != nil {
		a.log.Warn("read open spikes", "error", err)
		return
	}
	a.mu.Lock()
	cfg := withDefaults(a.config)
	a.mu.Unlock()
	rows := make(map[store.RuleKey]store.Spike)
	for _, sp := range open {
		k := store.RuleKey{Domain: sp.Domain, Rule: sp.Rule}
		rows[k] = sp
		st := d.rules[k]
		if st != nil && st.open {
			st.id, st.start, st.startBase = sp.ID, sp.Start.Unix(), sp.BaselinePerS
			st.peak = math.Max(st.peak, sp.PeakLimitedPerS)
			continue
		}
		now := a.now()
		sp.End = &now
		if err := a.st.CloseSpike(ctx, sp.ID, now, sp.PeakLimitedPerS, a.deliveries(cfg, EventSpikeEnd, sp)); err != nil {
			a.log.Warn("close spike", "error", err)
		}
	}
	for k, st := range d.rules {
		if _, ok := rows[k]; st.open && !ok {
			a.record(ctx, cfg, &event{key: k, start: true, st: st, t: st.start})
		}
	}
}

// alertBody is what a webhook receives. Text makes it a valid Slack
// incoming-webhook message; the other fields are for programs.
type alertBody struct {
	Event        string  `json:"event"`
	Domain       string  `json:"domain"`
	Rule         string  `json:"rule"`
	LimitedPerS  float64 `json:"limited_per_s"`
	BaselinePerS float64 `json:"baseline_per_s"`
	StartedAt    string  `json:"started_at"`
	EndedAt      string  `json:"ended_at,omitempty"`
	URL          string  `json:"url"`
	Text         string  `json:"text"`
}

// deliveries builds one delivery of event for each webhook that wants it.
func (a *Aggregator) deliveries(cfg store.AlertConfig, event string, sp store.Spike) []store.Delivery {
	body := alertBody{Event: event, Domain: sp.Domain, Rule: sp.Rule, LimitedPerS: sp.PeakLimitedPerS,
		BaselinePerS: sp.BaselinePerS, StartedAt: sp.Start.UTC().Format(time.RFC3339), URL: a.dashboardURL(sp.Domain, sp.Rule)}
	switch event {
	case EventSpikeStart:
		body.Text = fmt.Sprintf("Spike of 429s on %s / %s: %.0f/s (baseline %.1f/s) since %s. %s",
			sp.Domain, sp.Rule, sp.PeakLimitedPerS, sp.BaselinePerS, sp.Start.UTC().Format("15:04:05 MST"), body.URL)
	case EventSpikeEnd:
		body.EndedAt = sp.End.UTC().Format(time.RFC3339)
		body.Text = fmt.Sprintf("Spike of 429s on %s / %s is over: it peaked at %.0f/s (baseline %.1f/s), %s to %s. %s",
			sp.Domain, sp.Rule, sp.PeakLimitedPerS, sp.BaselinePerS, sp.Start.UTC().Format("15:04:05"), sp.End.UTC().Format("15:04:05 MST"), body.URL)
	case EventTest:
		body.Text = "Test alert from Sluice: this webhook receives spike alerts. " + body.URL
	}
	payload, _ := json.Marshal(body)
	var out []store.Delivery
	for _, w := range cfg.Webhooks {
		if event != EventTest && len(w.Events) > 0 && !slices.Contains(w.Events, event) {
			continue
		}
		out = append(out, store.Delivery{Event: event, URL: w.URL, Domain: sp.Domain, Rule: sp.Rule, Payload: payload})
	}
	return out
}

// dashboardURL links to the Live traffic page of a rule.
func (a *Aggregator) dashboardURL(domain, rule string) string {
	q := url.Values{}
	if domain != "" {
		q.Set("domain", domain)
	}
	if rule != "" {
		q.Set("rule", rule)
	}
	u := a.publicURL + "/traffic"
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return u
}

// TestAlert queues a test delivery to every webhook and returns how many.
func (a *Aggregator) TestAlert(ctx context.Context) (int, error) {
	cfg := a.Config()
	ds := a.deliveries(cfg, EventTest, store.Spike{Start: a.now()})
	if err := a.st.QueueDeliveries(ctx, ds); err != nil {
		return 0, err
	}
	return len(ds), nil
}

// deliverLoop sends due deliveries every second until ctx ends.
func (a *Aggregator) deliverLoop(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		due, err := a.st.DueDeliveries(ctx, 50)
		if err != nil {
			continue
		}
		for _, d := range due {
			errText := a.post(ctx, d)
			if ctx.Err() != nil {
				return
			}
			var next time.Time
			if errText != "" && d.Attempts+1 < maxAttempts {
				next = a.now().Add(min(time.Second<<d.Attempts, maxBackoff))
			}
			if err := a.st.RecordAttempt(ctx, d.ID, errText, next); err != nil {
				a.log.Warn("record alert delivery", "error", err)
			}
			if errText != "" && next.IsZero() {
				a.log.Warn("alert delivery failed for good", "url", redactURL(d.URL), "event", d.Event, "error", errText)
			}
		}
	}
}

// post sends one delivery; it returns the reason it failed, "" when the
// target answered 2xx.
func (a *Aggregator) post(ctx context.Context, d store.Delivery) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.URL, bytes.NewReader(d.Payload))
	if err != nil {
		return err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "sluice-console")
	resp, err := a.client.Do(req)
	if err != nil {
		// The error names the URL, which may carry a secret (Slack's do).
		if ue, ok := err.(*url.Error); ok {
			return ue.Err.Error()
		}
		return err.Error()
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Sprintf("HTTP %d", resp.StatusCode)
	}
	return ""
}

// redactURL keeps a URL's scheme and host: webhook paths are secrets.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(invalid URL)"
	}
	return u.Scheme + "://" + u.Host + "/…"
}

// pollSpikes sends the streams every spike opened, raised or closed since
// last (by any replica's leader) and returns the newest change's time.
func (a *Aggregator) pollSpikes(ctx context.Context, last time.Time) time.Time {
	if last.IsZero() {
		return a.now().Add(-2 * time.Second)
	}
	changed, err := a.st.SpikesUpdatedSince(ctx, last)
	if err != nil {
		return last
	}
	for _, sp := range changed {
		last = maxTime(last, sp.UpdatedAt)
		state := "start"
		if sp.End != nil {
			state = "end"
		}
		v := spikeView(sp)
		a.broadcast(func(s *Subscription) any {
			if s.domain != "" && s.domain != v.Domain {
				return nil
			}
			return spikeMessage{Type: "spike", State: state, SpikeView: v}
		})
	}
	return last
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
