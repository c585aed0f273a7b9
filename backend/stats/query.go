package stats

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules/wire"
)

// Bounds of history queries.
const (
	// MaxHistoryPoints bounds the buckets of one rule in a history answer.
	MaxHistoryPoints = 10000
	// MaxRange bounds a history or totals query's range.
	MaxRange = 31 * 24 * time.Hour
)

// RuleSeries is one rule's points (only those with counts, oldest first)
// and, in live answers, its most limited values over the window.
type RuleSeries struct {
	Domain     string              `json:"domain"`
	Rule       string              `json:"rule"`
	Points     []store.SeriesPoint `json:"points"`
	TopLimited []wire.ValueCount   `json:"top_limited,omitempty"`
	// Masked is set when TopLimited's values are masked.
	Masked bool `json:"masked,omitempty"`
}

// SpikeView is a spike as the API shows it.
type SpikeView struct {
	ID              int64   `json:"id"`
	Domain          string  `json:"domain"`
	Rule            string  `json:"rule"`
	Start           int64   `json:"start"`
	End             *int64  `json:"end"`
	PeakLimitedPerS float64 `json:"peak_limited_per_s"`
	BaselinePerS    float64 `json:"baseline_per_s"`
}

func spikeView(s store.Spike) SpikeView {
	v := SpikeView{ID: s.ID, Domain: s.Domain, Rule: s.Rule, Start: s.Start.Unix(), PeakLimitedPerS: s.PeakLimitedPerS, BaselinePerS: s.BaselinePerS}
	if s.End != nil {
		end := s.End.Unix()
		v.End = &end
	}
	return v
}

// View is a live or history answer.
type View struct {
	Step    int64        `json:"step_s"`
	From    int64        `json:"from"`
	To      int64        `json:"to"`
	Rules   []RuleSeries `json:"rules"`
	Markers []Marker     `json:"markers"`
	Spikes  []SpikeView  `json:"spikes"`
}

// Live returns the last WindowSeconds complete seconds of domain's rules
// ("" for every domain), with each rule's most limited values over the
// window (masked when masked is set and the domain masks its values), the
// version markers and the spikes of the window.
func (a *Aggregator) Live(ctx context.Context, domain string, masked bool) (View, error) {
	to := a.now().Unix() - 1
	from := to - WindowSeconds + 1
	v := View{Step: 1, From: from, To: to, Rules: []RuleSeries{}}
	a.mu.Lock()
	key := a.maskKey
	for k, s := range a.series {
		if domain != "" && k.Domain != domain {
			continue
		}
		rs := RuleSeries{Domain: k.Domain, Rule: k.Rule, Points: []store.SeriesPoint{}}
		var top []wire.ValueCount
		for t := from; t <= to; t++ {
			c, tp := s.get(t)
			if c.Zero() {
				continue
			}
			rs.Points = append(rs.Points, store.SeriesPoint{T: t, Counts: c})
			top = mergeTop(top, tp)
		}
		if len(rs.Points) == 0 {
			continue
		}
		if masked && a.masksLocked(k.Domain) && len(top) > 0 {
			rs.Masked = true
			for i := range top {
				top[i].Value = mask(key, k.Domain, top[i].Value)
			}
		}
		rs.TopLimited = top
		v.Rules = append(v.Rules, rs)
	}
	a.mu.Unlock()
	sortSeries(v.Rules)
	var err error
	// Events up to now: a publish of this very second is shown at once.
	if v.Markers, v.Spikes, err = a.events(ctx, domain, time.Unix(from, 0), a.now().Add(time.Second)); err != nil {
		return View{}, err
	}
	return v, nil
}

func sortSeries(rs []RuleSeries) {
	slices.SortFunc(rs, func(x, y RuleSeries) int {
		return cmp.Or(cmp.Compare(x.Domain, y.Domain), cmp.Compare(x.Rule, y.Rule))
	})
}

// events returns the markers and spikes of domain ("" for all) in
// [from, to).
func (a *Aggregator) events(ctx context.Context, domain string, from, to time.Time) ([]Marker, []SpikeView, error) {
	versions, _, err := a.st.ListVersions(ctx, store.VersionFilter{Domain: domain, Since: from, Until: to, Limit: 1000})
	if err != nil {
		return nil, nil, err
	}
	markers := make([]Marker, 0, len(versions))
	for i := len(versions) - 1; i >= 0; i-- { // oldest first
		markers = append(markers, markerOf(versions[i]))
	}
	if markers, err = a.withPromotions(ctx, markers, domain, from, to); err != nil {
		return nil, nil, err
	}
	list, err := a.st.ListSpikes(ctx, domain, from, to)
	if err != nil {
		return nil, nil, err
	}
	spikes := make([]SpikeView, len(list))
	for i, s := range list {
		spikes[i] = spikeView(s)
	}
	return markers, spikes, nil
}

// Query is a history or totals query.
type Query struct {
	Domain, Rule string
	From, To     time.Time
	Step         int64 // history: bucket seconds, a multiple of 60
}

// CheckRange reports what is wrong with a query's range, for a 400.
func (q Query) CheckRange(history bool) error {
	switch {
	case !q.From.Before(q.To):
		return fmt.Errorf("from (%s) must be before to (%s)", q.From.UTC().Format(time.RFC3339), q.To.UTC().Format(time.RFC3339))
	case q.To.Sub(q.From) > MaxRange:
		return fmt.Errorf("the range is over %d days", int(MaxRange/(24*time.Hour)))
	case q.Rule != "" && q.Domain == "":
		return fmt.Errorf("rule needs a domain")
	}
	if !history {
		return nil
	}
	switch {
	case q.Step <= 0 || q.Step%60 != 0:
		return fmt.Errorf("step must be a positive multiple of 60 seconds")
	case int64(q.To.Sub(q.From)/time.Second)/q.Step > MaxHistoryPoints:
		return fmt.Errorf("the range holds over %d steps of %d s: choose a larger step", MaxHistoryPoints, q.Step)
	}
	return nil
}

// History returns the per-minute rollups of the selected rules summed into
// buckets of q.Step seconds, with the markers and spikes of the range.
// The current minute is not rolled up yet; Live has it.
func (a *Aggregator) History(ctx context.Context, q Query) (View, error) {
	from := q.From.Truncate(time.Duration(q.Step) * time.Second)
	series, err := a.st.MinuteSeries(ctx, store.StatsQuery{Domain: q.Domain, Rule: q.Rule, From: from, To: q.To}, q.Step)
	if err != nil {
		return View{}, err
	}
	v := View{Step: q.Step, From: from.Unix(), To: q.To.Unix(), Rules: make([]RuleSeries, 0, len(series))}
	for k, pts := range series {
		v.Rules = append(v.Rules, RuleSeries{Domain: k.Domain, Rule: k.Rule, Points: pts})
	}
	sortSeries(v.Rules)
	if v.Markers, v.Spikes, err = a.events(ctx, q.Domain, from, q.To); err != nil {
		return View{}, err
	}
	return v, nil
}

// Totals returns the exact sums of the decisions in [q.From, q.To) per
// rule: whole seconds from the live window where it covers the range,
// whole minutes from the rollups before it (a range starting before the
// window is counted from the start of its first minute).
func (a *Aggregator) Totals(ctx context.Context, q Query) ([]store.RuleCounts, error) {
	now := a.now().Unix()
	// The live window's first whole minute: everything from it on is in
	// memory, everything before it in the rollups.
	split := now - WindowSeconds + 60
	split -= split % 60
	from, to := q.From.Unix(), q.To.Unix()
	sums := make(map[store.RuleKey]store.Counts)
	if from < split {
		rows, err := a.st.MinuteTotals(ctx, store.StatsQuery{Domain: q.Domain, Rule: q.Rule,
			From: time.Unix(from-from%60, 0), To: time.Unix(min(to, split), 0)})
		if err != nil {
			return nil, err
		}
		for _, r := range rows {
			sums[r.RuleKey] = r.Counts
		}
	}
	if to > split {
		a.mu.Lock()
		for k, s := range a.series {
			if (q.Domain != "" && k.Domain != q.Domain) || (q.Rule != "" && k.Rule != q.Rule) {
				continue
			}
			c := sums[k]
			for t := max(from, split); t < to; t++ {
				got, _ := s.get(t)
				c.Add(got)
			}
			if !c.Zero() {
				sums[k] = c
			}
		}
		a.mu.Unlock()
	}
	out := make([]store.RuleCounts, 0, len(sums))
	for k, c := range sums {
		out = append(out, store.RuleCounts{RuleKey: k, Counts: c})
	}
	slices.SortFunc(out, func(x, y store.RuleCounts) int {
		return cmp.Or(cmp.Compare(x.Domain, y.Domain), cmp.Compare(x.Rule, y.Rule))
	})
	return out, nil
}

// DomainSpark is one domain's last WindowSeconds in buckets of SparkStep
// seconds, oldest first.
type DomainSpark struct {
	Domain  string  `json:"domain"`
	Allowed []int64 `json:"allowed"`
	Limited []int64 `json:"limited"`
}

// SparkStep is the bucket of the domains' sparklines.
const SparkStep = 10

// Sparks returns every domain's allowed and limited counts over the
// window, summed over its rules, in buckets of SparkStep seconds; the
// first bucket starts at the returned Unix second.
func (a *Aggregator) Sparks() (int64, []DomainSpark) {
	const buckets = WindowSeconds / SparkStep
	to := a.now().Unix() // exclusive
	to -= to % SparkStep
	from := to - buckets*SparkStep
	byDomain := make(map[string]*DomainSpark)
	a.mu.Lock()
	for k, s := range a.series {
		d := byDomain[k.Domain]
		if d == nil {
			d = &DomainSpark{Domain: k.Domain, Allowed: make([]int64, buckets), Limited: make([]int64, buckets)}
			byDomain[k.Domain] = d
		}
		for t := from; t < to; t++ {
			c, _ := s.get(t)
			i := (t - from) / SparkStep
			d.Allowed[i] += c.Allowed
			d.Limited[i] += c.Limited
		}
	}
	a.mu.Unlock()
	out := make([]DomainSpark, 0, len(byDomain))
	for _, d := range byDomain {
		out = append(out, *d)
	}
	slices.SortFunc(out, func(x, y DomainSpark) int { return cmp.Compare(x.Domain, y.Domain) })
	return from, out
}
