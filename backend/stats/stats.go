// Package stats is the console's live traffic: it sums the enforcers'
// per-second stats reports into fleet-wide series per rule, keeps the last
// 15 minutes at one-second resolution in memory and every minute in
// Postgres, finds spikes of 429s, sends alerts, and feeds the browsers'
// live streams.
//
// Fleet-wide, on every replica: each replica adds its own nodes' reports to
// its series at once, and once a second writes what they counted in each
// closed second as one frame (a row in stats_frames). Every replica reads
// the other replicas' frames a few times a second (and, when it starts,
// those of the last 15 minutes), so each one answers for every node of
// every replica: a report reaches the series of its own replica at once
// and those of the others within about half a second.
//
// A report counts in the second the console received it. Per-minute
// rollups are written by each replica for its own nodes only, once the
// minute is over, adding to what the other replicas wrote (ON CONFLICT
// adds): never counted twice, and equal to the sum of the minute's
// seconds.
//
// Cost, per replica, for R active rules reported by N nodes each second:
// R·N map updates a second, one frame row written and one read per other
// replica a second, and 900 slots of 48 bytes per rule (about 43 MB for
// 1,000 rules). See BENCHMARKS.md.
//
// Spikes and alerts are the work of one replica, the leader (a Postgres
// advisory lock); the others learn of spikes from Postgres. See spikes.go.
package stats

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules/wire"
)

// Bounds of the live series.
const (
	// WindowSeconds is how many seconds of one-second points are kept.
	WindowSeconds = 900
	// MaxSeries bounds the rules tracked at once; reports of further rules
	// are refused.
	MaxSeries = 20000
	// MaxCount bounds one count of one rule in one report
	// (wire.MaxStatsCount).
	MaxCount = wire.MaxStatsCount
	// MaxNameBytes bounds a reported domain, rule or value.
	MaxNameBytes = wire.MaxNameBytes
	// topKept is how many limited values one second of a rule keeps.
	topKept = wire.MaxTopValues
)

// DefaultRetention is how long per-minute rollups are kept.
const DefaultRetention = 30 * 24 * time.Hour

// Config configures an Aggregator.
type Config struct {
	Store *store.Store
	Log   *slog.Logger
	// Replica names this console replica in the frames it writes.
	Replica string
	// Retention is how long rollups, spikes and deliveries are kept
	// (DefaultRetention when zero).
	Retention time.Duration
	// PublicURL is the console's address as users reach it, for the links
	// in alerts.
	PublicURL string
	// Client sends webhooks; a client with a 5 s timeout when nil.
	Client *http.Client
	// SpikeWarmup is how long a rule is watched before its spikes are
	// judged (DefaultSpikeWarmup when zero; see spikes.go).
	SpikeWarmup time.Duration
	// ValueRetention is how long per-value rollups are kept
	// (DefaultValueRetention when zero; see values.go).
	ValueRetention time.Duration
}

// Aggregator holds the fleet's live series. It is safe for concurrent use.
type Aggregator struct {
	st        *store.Store
	log       *slog.Logger
	replica   string
	retention time.Duration
	publicURL string
	client    *http.Client
	warmup    time.Duration
	refused   *prometheus.CounterVec
	now       func() time.Time

	mu       sync.Mutex
	series   map[store.RuleKey]*series
	pending  map[int64]map[store.RuleKey]*store.FrameRule // own counts per second, not yet in a frame
	minutes  map[minuteKey]store.Counts                   // own counts per minute, not yet rolled up
	seen     map[int64]int64                              // frame ids read from others → when (Unix second)
	domains  map[string]bool                              // domains of every version seen
	version  int64                                        // newest version seen
	config   store.AlertConfig
	maskKey  []byte
	subs     map[*Subscription]struct{}
	reports  uint64                          // reports ingested, for duplicate marks
	scratch  []*series                       // Ingest's, reused
	canary   map[store.RuleKey]*canarySeries // the canary cohort's share (cohort.go)
	promoted time.Time                       // newest promote seen (cohort.go)
	pv       previewBuffer                   // the impact preview's spans, not yet written (preview.go)

	valueRetention time.Duration
	sketched       int                // values in every series' minute sketch (values.go)
	valueWrites    []store.ValueWrite // per-value rollups not yet written
	valueRows      int                // values in valueWrites
}

type minuteKey struct {
	minute int64 // Unix second of the minute's start
	store.RuleKey
}

// series is one rule's last WindowSeconds seconds, a ring indexed by the
// Unix second modulo WindowSeconds.
type series struct {
	key   store.RuleKey
	mark  uint64    // the report that last named it (duplicate check)
	own   ownCounts // what this replica's nodes counted, not yet written
	slots [WindowSeconds]slot
}

// ownCounts are a rule's counts from this replica's own nodes in one
// second (not yet in a frame) and one minute (not yet rolled up).
type ownCounts struct {
	sec    int64
	secC   store.Counts
	secCA  int64 // the canary cohort's share of secC's allowed and limited
	secCL  int64
	secTop []wire.ValueCount
	min    int64
	minC   store.Counts
	minV   *valueSketch // the minute's limited values (values.go)
}

type slot struct {
	t   int64 // the second the slot holds; another value means empty
	c   store.Counts
	top []wire.ValueCount
}

// at returns the slot of second t, emptied when it held an older second.
func (s *series) at(t int64) *slot {
	sl := &s.slots[t%WindowSeconds]
	if sl.t != t {
		*sl = slot{t: t}
	}
	return sl
}

// get returns the counts of second t (zero when not held).
func (s *series) get(t int64) (store.Counts, []wire.ValueCount) {
	sl := &s.slots[t%WindowSeconds]
	if sl.t != t {
		return store.Counts{}, nil
	}
	return sl.c, sl.top
}

// New returns an Aggregator; Run must run for it to exchange frames, write
// rollups and feed streams.
func New(cfg Config) *Aggregator {
	a := &Aggregator{
		st: cfg.Store, log: cfg.Log, replica: cfg.Replica, retention: cmp.Or(cfg.Retention, DefaultRetention),
		publicURL: cfg.PublicURL, client: cfg.Client, warmup: cmp.Or(cfg.SpikeWarmup, DefaultSpikeWarmup), now: time.Now,
		series:  make(map[store.RuleKey]*series),
		pending: make(map[int64]map[store.RuleKey]*store.FrameRule),
		minutes: make(map[minuteKey]store.Counts),
		seen:    make(map[int64]int64),
		domains: make(map[string]bool),
		subs:    make(map[*Subscription]struct{}),
	}
	a.valueRetention = cmp.Or(cfg.ValueRetention, DefaultValueRetention)
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	if a.client == nil {
		a.client = &http.Client{Timeout: 5 * time.Second}
	}
	a.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_console_stats_refused_total",
		Help: "Stats reports from nodes refused, never aggregated, by reason.",
	}, []string{"reason"})
	return a
}

// Collectors returns the aggregator's metrics, for the console's /metrics.
func (a *Aggregator) Collectors() []prometheus.Collector { return []prometheus.Collector{a.refused} }

// RefusedError is a stats report the aggregator refused as a whole.
type RefusedError struct {
	Reason string // a metric label: unknown_domain, too_large, invalid
	Detail string
}

func (e *RefusedError) Error() string { return "stats refused: " + e.Detail }

func refuse(reason, format string, args ...any) *RefusedError {
	return &RefusedError{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// Refused counts a report refused before it reached Ingest (the hub found
// it malformed).
func (a *Aggregator) Refused(reason string) { a.refused.WithLabelValues(reason).Inc() }

// AddDomains adds domains to those of the versions seen (reload adds the
// newest version's every second; the hub adds each version's before it
// sends it to a node, so that the first reports under it are not refused).
func (a *Aggregator) AddDomains(domains ...string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, d := range domains {
		a.domains[d] = true
	}
}

// Ingest adds one node's report, received at at, to the second it was
// received in. A report is taken whole or refused whole (a
// *RefusedError, also counted): structurally invalid (see
// wire.Stats.Validate), a count over MaxCount, a top value counted more
// than the rule limited, a name that is empty, over MaxNameBytes, not
// UTF-8 or with a NUL, a rule twice, a domain no version has, or a rule
// beyond MaxSeries.
func (a *Aggregator) Ingest(m *wire.Stats, at time.Time) error {
	return a.ingestAs(m, at, false)
}

func (a *Aggregator) ingestAs(m *wire.Stats, at time.Time, canary bool) error {
	err := a.ingest(m, at, canary)
	var re *RefusedError
	if errors.As(err, &re) {
		a.refused.WithLabelValues(re.Reason).Inc()
	}
	return err
}

func (a *Aggregator) ingest(m *wire.Stats, at time.Time, canary bool) error {
	if err := m.Validate(); err != nil {
		return refuse("invalid", "%s", err.Error())
	}
	for i, r := range m.Rules {
		if err := checkRule(r); err != nil {
			return refuse("invalid", "rules[%d]: %s", i, err)
		}
	}
	t := at.Unix()
	now := a.now().Unix()
	if t <= now-WindowSeconds || t > now+5 {
		return refuse("invalid", "received at %s, outside the window", at.UTC().Format(time.RFC3339))
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	// First pass, changing nothing but the duplicate marks: is every rule
	// acceptable? The series found are kept for the second pass.
	a.reports++
	found := a.scratch[:0]
	var fresh map[store.RuleKey]bool
	for i, r := range m.Rules {
		k := store.RuleKey{Domain: r.Domain, Rule: r.Rule}
		if !a.domains[r.Domain] {
			return refuse("unknown_domain", "rules[%d]: no version has domain %q", i, r.Domain)
		}
		s := a.series[k]
		switch {
		case s != nil && s.mark == a.reports, s == nil && fresh[k]:
			return refuse("invalid", "rules[%d]: rule %s/%s reported twice", i, r.Domain, r.Rule)
		case s != nil:
			s.mark = a.reports
		default:
			if fresh == nil {
				fresh = make(map[store.RuleKey]bool)
			}
			fresh[k] = true
		}
		found = append(found, s)
	}
	if len(a.series)+len(fresh) > MaxSeries {
		return refuse("too_many_rules", "over %d rules tracked", MaxSeries)
	}
	preview, re := a.checkPreviewLocked(m, now)
	if re != nil {
		return re
	}
	a.pv.add(preview)
	a.scratch = found[:0]
	for i, r := range m.Rules {
		s := found[i]
		if s == nil {
			k := store.RuleKey{Domain: r.Domain, Rule: r.Rule}
			s = &series{key: k}
			a.series[k] = s
		}
		c := store.Counts{Allowed: r.Allowed, Limited: r.Limited, ShadowLimited: r.ShadowLimited, StoreErrors: r.StoreErrors}
		sl := s.at(t)
		sl.c.Add(c)
		sl.top = mergeTop(sl.top, r.TopLimited)
		a.own(s, t, c, r.TopLimited)
		a.addValuesLocked(s, &m.Rules[i])
		if canary {
			a.addCanaryLocked(s.key, t, c.Allowed, c.Limited)
			s.own.secCA, s.own.secCL = s.own.secCA+c.Allowed, s.own.secCL+c.Limited
		}
	}
	return nil
}

// own adds counts of this replica's nodes to s's second t and its minute,
// not yet written; caller holds a.mu. A series holds one second and one
// minute of them; an older one still there is moved to the pending maps.
func (a *Aggregator) own(s *series, t int64, c store.Counts, top []wire.ValueCount) {
	o := &s.own
	if o.sec != t {
		if !o.secC.Zero() || len(o.secTop) > 0 {
			a.spillSecond(o.sec, s.key, o.secC, o.secTop)
			a.spillCanary(o.sec, s.key, o.secCA, o.secCL)
		}
		o.sec, o.secC, o.secTop, o.secCA, o.secCL = t, store.Counts{}, nil, 0, 0
	}
	o.secC.Add(c)
	o.secTop = mergeTop(o.secTop, top)
	if minute := t - t%60; o.min != minute {
		if !o.minC.Zero() {
			a.spillMinute(o.min, s.key, o.minC)
		}
		a.spillValues(o.min, s.key, o.minC.Limited, o.minV)
		o.min, o.minC, o.minV = minute, store.Counts{}, nil
	}
	o.minC.Add(c)
}

// spillSecond adds to the pending frame of second t; caller holds a.mu.
func (a *Aggregator) spillSecond(t int64, k store.RuleKey, c store.Counts, top []wire.ValueCount) {
	frame := a.pending[t]
	if frame == nil {
		frame = make(map[store.RuleKey]*store.FrameRule)
		a.pending[t] = frame
	}
	fr := frame[k]
	if fr == nil {
		fr = &store.FrameRule{Domain: k.Domain, Rule: k.Rule}
		frame[k] = fr
	}
	fr.A, fr.L, fr.S, fr.E = fr.A+c.Allowed, fr.L+c.Limited, fr.S+c.ShadowLimited, fr.E+c.StoreErrors
	fr.Top = mergeTop(fr.Top, top)
}

// spillMinute adds to the pending rollup of minute; caller holds a.mu.
func (a *Aggregator) spillMinute(minute int64, k store.RuleKey, c store.Counts) {
	mk := minuteKey{minute, k}
	mc := a.minutes[mk]
	mc.Add(c)
	a.minutes[mk] = mc
}

func checkRule(r wire.RuleStats) error {
	if err := checkName("domain", r.Domain); err != nil {
		return err
	}
	if err := checkName("rule", r.Rule); err != nil {
		return err
	}
	for _, n := range []int64{r.Allowed, r.Limited, r.ShadowLimited, r.StoreErrors} {
		if n > MaxCount {
			return fmt.Errorf("count %d is over %d", n, int64(MaxCount))
		}
	}
	for j, v := range r.TopLimited {
		if err := checkName("value", v.Value); err != nil {
			return fmt.Errorf("top_limited[%d]: %w", j, err)
		}
		if v.Count < 0 || v.Count > r.Limited {
			return fmt.Errorf("top_limited[%d]: count %d is not within 0..limited (%d)", j, v.Count, r.Limited)
		}
	}
	for j, v := range r.Values { // counts: wire.Stats.Validate
		if err := checkName("value", v.Value); err != nil {
			return fmt.Errorf("values[%d]: %w", j, err)
		}
	}
	return nil
}

func checkName(what, s string) error {
	switch {
	case s == "" && what != "value":
		return fmt.Errorf("%s is empty", what)
	case len(s) > MaxNameBytes:
		return fmt.Errorf("%s is over %d bytes", what, MaxNameBytes)
	case !utf8.ValidString(s):
		return fmt.Errorf("%s is not valid UTF-8", what)
	}
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return fmt.Errorf("%s holds a NUL byte", what)
		}
	}
	return nil
}

// addLocked adds counts to rule k's second t, if t is within the window;
// caller holds a.mu.
func (a *Aggregator) addLocked(k store.RuleKey, t int64, c store.Counts, top []wire.ValueCount) {
	now := a.now().Unix()
	if t <= now-WindowSeconds || t > now+5 {
		return
	}
	s := a.series[k]
	if s == nil {
		s = &series{key: k}
		a.series[k] = s
	}
	sl := s.at(t)
	sl.c.Add(c)
	if len(top) > 0 {
		sl.top = mergeTop(sl.top, top)
	}
}

// mergeTop adds b's counts to a's, keeping the topKept most counted values
// (ties: by value), most first. It reuses a's array (the caller owns a) and
// never b's.
func mergeTop(a, b []wire.ValueCount) []wire.ValueCount {
	if len(b) == 0 {
		return a
	}
	if len(a) == 0 {
		a = make([]wire.ValueCount, 0, len(b))
	}
	for _, v := range b {
		if i := slices.IndexFunc(a, func(x wire.ValueCount) bool { return x.Value == v.Value }); i >= 0 {
			a[i].Count += v.Count
		} else {
			a = append(a, v)
		}
	}
	sortTop(a)
	if len(a) > topKept {
		a = a[:topKept]
	}
	return a
}

func sortTop(vs []wire.ValueCount) {
	slices.SortFunc(vs, func(x, y wire.ValueCount) int {
		return cmp.Or(cmp.Compare(y.Count, x.Count), cmp.Compare(x.Value, y.Value))
	})
}

// applyFrame adds another replica's frame to the series; caller holds a.mu.
func (a *Aggregator) applyFrameLocked(f store.Frame) {
	for _, r := range f.Rules {
		k := store.RuleKey{Domain: r.Domain, Rule: r.Rule}
		if a.series[k] == nil && len(a.series) >= MaxSeries {
			continue
		}
		a.addLocked(k, f.T, store.Counts{Allowed: r.A, Limited: r.L, ShadowLimited: r.S, StoreErrors: r.E}, r.Top)
		if r.CA > 0 || r.CL > 0 {
			a.addCanaryLocked(k, f.T, r.CA, r.CL)
		}
	}
}

// mask returns the stable masked form of a value of domain under key: an
// HMAC, so that a low-entropy value (a client address) cannot be found by
// hashing guesses without the key.
func mask(key []byte, domain, value string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(domain))
	m.Write([]byte{0})
	m.Write([]byte(value))
	return "masked:" + hex.EncodeToString(m.Sum(nil))[:12]
}

// masks reports whether viewers see domain's values masked; caller holds
// a.mu.
func (a *Aggregator) masksLocked(domain string) bool { return a.config.Domains[domain].MaskValues }

// Config returns the alert configuration with defaults filled in.
func (a *Aggregator) Config() store.AlertConfig {
	a.mu.Lock()
	defer a.mu.Unlock()
	return withDefaults(a.config)
}

// MaskedDomains returns the domains whose values viewers see masked.
func (a *Aggregator) MaskedDomains() map[string]bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]bool)
	for d, s := range a.config.Domains {
		if s.MaskValues {
			out[d] = true
		}
	}
	return out
}

// Defaults of spike detection.
var defaultSpike = store.SpikeSettings{FloorPerS: 5, Factor: 5, ForS: 3}

func withDefaults(c store.AlertConfig) store.AlertConfig {
	if c.SpikeDefaults.FloorPerS <= 0 {
		c.SpikeDefaults.FloorPerS = defaultSpike.FloorPerS
	}
	if c.SpikeDefaults.Factor <= 0 {
		c.SpikeDefaults.Factor = defaultSpike.Factor
	}
	if c.SpikeDefaults.ForS <= 0 {
		c.SpikeDefaults.ForS = defaultSpike.ForS
	}
	if c.Webhooks == nil {
		c.Webhooks = []store.Webhook{}
	}
	if c.Domains == nil {
		c.Domains = map[string]store.DomainStatsSettings{}
	}
	return c
}

// spikeSettings returns the spike settings of domain.
func spikeSettings(c store.AlertConfig, domain string) store.SpikeSettings {
	s := c.SpikeDefaults
	if d, ok := c.Domains[domain]; ok {
		if d.FloorPerS > 0 {
			s.FloorPerS = d.FloorPerS
		}
		if d.Factor > 0 {
			s.Factor = d.Factor
		}
		if d.ForS > 0 {
			s.ForS = d.ForS
		}
	}
	return s
}

// SetConfig makes c the configuration this replica uses (the API calls it
// after saving; other replicas reload within a few seconds).
func (a *Aggregator) SetConfig(c store.AlertConfig) {
	a.mu.Lock()
	a.config = c
	a.mu.Unlock()
}

// reload reads the configuration, the mask key and the newest version's
// domains, and emits a marker for each version published since the last
// reload.
func (a *Aggregator) reload(ctx context.Context) error {
	c, err := a.st.FindAlertConfig(ctx)
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.config = c
	needKey := a.maskKey == nil
	last := a.version
	a.mu.Unlock()
	if needKey {
		key, err := a.st.MaskKey(ctx)
		if err != nil {
			return err
		}
		a.mu.Lock()
		a.maskKey = key
		a.mu.Unlock()
	}
	current, err := a.st.CurrentVersion(ctx)
	if err != nil || current <= last {
		return err
	}
	snap, err := a.st.FindSnapshot(ctx, current)
	if err != nil {
		return err
	}
	var markers []Marker
	if last > 0 {
		for v := last + 1; v <= current && v <= last+100; v++ {
			if ver, err := a.st.FindVersion(ctx, v); err == nil {
				markers = append(markers, markerOf(ver))
			}
		}
	}
	a.mu.Lock()
	for _, d := range snap.Domains {
		a.domains[d.Name] = true
	}
	a.version = current
	a.mu.Unlock()
	for _, m := range markers {
		a.broadcast(func(s *Subscription) any {
			if s.domain != "" && !slices.Contains(m.Domains, s.domain) {
				return nil
			}
			return markerMessage{Type: "marker", Marker: m}
		})
	}
	return nil
}

// Marker is a version event on the time axis.
type Marker struct {
	T       int64  `json:"t"`
	Version int64  `json:"version"`
	Kind    string `json:"kind"` // publish, rollback or promote
	Author  string `json:"author"`
	Message string `json:"message"`
	// Domains are the domains the version changed.
	Domains []string `json:"domains"`
}

func markerOf(v store.Version) Marker {
	kind := "publish"
	if v.RollbackOf != nil {
		kind = "rollback"
	}
	return Marker{T: v.CreatedAt.Unix(), Version: v.Version, Kind: kind, Author: v.Author, Message: v.Message, Domains: v.Domains}
}
