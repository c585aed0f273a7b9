package engine_test

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/wire"
)

const previewYAML = `domain: pv
descriptors:
  - key: user
    algorithm: fixed_window
    rate_limit: {unit: second, requests_per_unit: 5, name: per-user}
  - key: a
    descriptors:
      - key: b
        rate_limit: {unit: minute, requests_per_unit: 1000, name: ab}
`

func hb(c, n int64) wire.HistBucket { return wire.HistBucket{int64(wire.Bucket(c)), n, n * c} }

// TestTakePreview: a minute of known per-value traffic gives exactly the
// histograms it should, once the minute is over, and not before.
func TestTakePreview(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		eng := engine.New(limiter.NewLocal(limiter.LocalOptions{}), "pv:")
		if err := eng.Apply(1, compile(t, previewYAML)); err != nil {
			t.Fatal(err)
		}
		send := func(n int, entries ...rules.Entry) {
			for range n {
				r := engine.Request{Domain: "pv", Descriptors: []engine.Descriptor{{Entries: entries}}}
				check(t, eng, r)
			}
		}
		start := time.Now().Unix()
		// Second 0: u1 8 times (3 limited), u2 twice; second 1: u1 3
		// times; second 2: u2 40 times (35 limited).
		send(8, rules.Entry{Key: "user", Value: "u1"})
		send(2, rules.Entry{Key: "user", Value: "u2"})
		send(2, rules.Entry{Key: "a", Value: "x"}, rules.Entry{Key: "b", Value: "y"})
		send(1, rules.Entry{Key: "a", Value: "x"}, rules.Entry{Key: "b", Value: "z"})
		time.Sleep(time.Second)
		send(3, rules.Entry{Key: "user", Value: "u1"})
		time.Sleep(time.Second)
		send(40, rules.Entry{Key: "user", Value: "u2"})
		if got := eng.TakePreview(); len(got) != 0 {
			t.Fatalf("before the span ends: %+v, want nothing", got)
		}

		time.Sleep(time.Minute)
		want := []wire.RulePreview{
			{Domain: "pv", Rule: "ab", T: start, SpanS: 60, Requests: 3,
				Second: wire.Histogram{hb(1, 1), hb(2, 1)}, Peak: wire.Histogram{hb(1, 1), hb(2, 1)}, Span: wire.Histogram{hb(1, 1), hb(2, 1)}},
			{Domain: "pv", Rule: "per-user", T: start, SpanS: 60, Requests: 53, Limited: 38,
				Second: wire.Histogram{hb(2, 1), hb(3, 1), hb(8, 1), hb(40, 1)},
				Peak:   wire.Histogram{hb(8, 1), hb(40, 1)},
				Span:   wire.Histogram{hb(11, 1), hb(42, 1)}},
		}
		got := eng.TakePreview()
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("the minute's preview (-want +got):\n%s", diff)
		}
		st := wire.Stats{Type: wire.TypeStats, IntervalMS: 1000, Preview: got}
		if err := st.Validate(); err != nil {
			t.Errorf("the node's own report does not validate: %v", err)
		}
		if got := eng.TakePreview(); len(got) != 0 {
			t.Errorf("taken twice: %+v", got)
		}
	})
}

// TestTakePreviewBounded: past the per-rule bound of tracked values, new
// values count as untracked and use no memory.
func TestTakePreviewBounded(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		eng := engine.New(limiter.NewLocal(limiter.LocalOptions{}), "pv:")
		if err := eng.Apply(1, compile(t, previewYAML)); err != nil {
			t.Fatal(err)
		}
		const values = 4096 + 100
		for i := range values {
			check(t, eng, engine.Request{Domain: "pv", Descriptors: []engine.Descriptor{{Entries: []rules.Entry{{Key: "user", Value: fmt.Sprint(i)}}}}})
		}
		time.Sleep(time.Minute)
		got := eng.TakePreview()
		if len(got) != 1 {
			t.Fatalf("got %d spans, want 1", len(got))
		}
		n, _ := got[0].Span.Entries()
		if got[0].Requests != values || got[0].Untracked != 100 || n != 4096 {
			t.Errorf("requests %d, untracked %d, tracked values %d; want %d, 100, 4096", got[0].Requests, got[0].Untracked, n, values)
		}
	})
}
