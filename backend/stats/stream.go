package stats

import (
	"cmp"
	"encoding/json"
	"slices"
	"sync"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules/wire"
)

// subscriptionQueue is how many messages may wait for one browser; a
// browser that falls further behind is dropped (it reconnects and loads
// the window again), so a slow reader never grows the console's memory.
const subscriptionQueue = 16

// Subscription is one browser's live stream: a tick every second, and
// marker and spike messages as they happen, JSON-encoded.
type Subscription struct {
	a      *Aggregator
	domain string // "" for every domain
	masked bool   // mask the values of masked domains
	c      chan []byte
	once   sync.Once
	// Dropped is closed when the stream fell behind and was dropped.
	dropped chan struct{}
}

// Subscribe starts a stream of domain ("" for all); masked shows the values
// of masked domains masked (for viewers).
func (a *Aggregator) Subscribe(domain string, masked bool) *Subscription {
	s := &Subscription{a: a, domain: domain, masked: masked, c: make(chan []byte, subscriptionQueue), dropped: make(chan struct{})}
	a.mu.Lock()
	a.subs[s] = struct{}{}
	a.mu.Unlock()
	return s
}

// Messages returns the stream's messages.
func (s *Subscription) Messages() <-chan []byte { return s.c }

// Dropped is closed when the subscriber fell too far behind.
func (s *Subscription) Dropped() <-chan struct{} { return s.dropped }

// Close ends the subscription.
func (s *Subscription) Close() {
	s.a.mu.Lock()
	delete(s.a.subs, s)
	s.a.mu.Unlock()
}

// send queues msg, dropping the subscriber when its queue is full.
func (s *Subscription) send(msg []byte) {
	select {
	case s.c <- msg:
	default:
		s.once.Do(func() { close(s.dropped) })
	}
}

// TickRule is one rule's counts in a tick.
type TickRule struct {
	Domain string `json:"domain"`
	Rule   string `json:"rule"`
	store.Counts
	TopLimited []wire.ValueCount `json:"top_limited,omitempty"`
}

type tickMessage struct {
	Type  string     `json:"type"`
	T     int64      `json:"t"`
	Rules []TickRule `json:"rules"`
}

type markerMessage struct {
	Type string `json:"type"`
	Marker
}

type spikeMessage struct {
	Type  string `json:"type"`
	State string `json:"state"` // start or end
	SpikeView
}

// tick sends every subscriber the counts of second t.
func (a *Aggregator) tick(t int64) {
	a.mu.Lock()
	if len(a.subs) == 0 {
		a.mu.Unlock()
		return
	}
	rules := make([]TickRule, 0, len(a.series))
	for k, s := range a.series {
		c, top := s.get(t)
		if c.Zero() {
			continue
		}
		rules = append(rules, TickRule{Domain: k.Domain, Rule: k.Rule, Counts: c, TopLimited: slices.Clone(top)})
	}
	a.mu.Unlock()
	slices.SortFunc(rules, func(x, y TickRule) int {
		return cmp.Or(cmp.Compare(x.Domain, y.Domain), cmp.Compare(x.Rule, y.Rule))
	})
	a.broadcast(func(s *Subscription) any {
		out := make([]TickRule, 0, len(rules))
		for _, r := range rules {
			if s.domain != "" && r.Domain != s.domain {
				continue
			}
			r.TopLimited = a.maskTop(r.Domain, r.TopLimited, s.masked)
			out = append(out, r)
		}
		return tickMessage{Type: "tick", T: t, Rules: out}
	})
}

// broadcast encodes msg(s) for each subscriber s (nil skips it) and queues
// it.
func (a *Aggregator) broadcast(msg func(s *Subscription) any) {
	a.mu.Lock()
	subs := make([]*Subscription, 0, len(a.subs))
	for s := range a.subs {
		subs = append(subs, s)
	}
	a.mu.Unlock()
	for _, s := range subs {
		m := msg(s)
		if m == nil {
			continue
		}
		data, err := json.Marshal(m)
		if err != nil {
			a.log.Error("encode stats message", "error", err)
			return
		}
		s.send(data)
	}
}

// maskTop returns top with its values masked when masked is set and the
// domain masks its values.
func (a *Aggregator) maskTop(domain string, top []wire.ValueCount, masked bool) []wire.ValueCount {
	if !masked || len(top) == 0 {
		return top
	}
	a.mu.Lock()
	on, key := a.masksLocked(domain), a.maskKey
	a.mu.Unlock()
	if !on {
		return top
	}
	out := make([]wire.ValueCount, len(top))
	for i, v := range top {
		out[i] = wire.ValueCount{Value: mask(key, domain, v.Value), Count: v.Count}
	}
	return out
}
