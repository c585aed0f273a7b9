package enforcer

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/internal/testenv"
)

// TestRedisFaultsUnderLoad runs a node's engine (Batcher, 50 ms store
// timeout, breaker) through an in-process toxiproxy to Redis and degrades
// the connection for a second under load, one fault at a time: what the
// checks get during the fault, how long the failure mode answers, and that
// Redis decides again by itself once the fault is gone, with nothing it
// admitted lost.
func TestRedisFaultsUnderLoad(t *testing.T) {
	// Not parallel: it asserts latencies under load.
	if testing.Short() {
		t.Skip("fault test puts load through a proxy")
	}
	const fault = time.Second
	for _, tt := range []struct {
		name, typ, stream string
		attrs             map[string]any
		trips             bool          // the breaker must open
		settle            time.Duration // load kept on after the fault (default 2 s)
	}{
		// Every reply 100 ms late: past the 50 ms timeout.
		{"latency 100ms", "latency", "downstream", map[string]any{"latency": 100}, true, 0},
		// Every connection reset (TCP RST) as soon as data arrives.
		{"reset peer", "reset_peer", "upstream", map[string]any{"timeout": 0}, true, 0},
		// Replies at 1 KB/s: most take longer than the timeout. Some small
		// ones do not, and then the breaker rightly stays closed (its quiet
		// rule: the store is slow, not down) while checks pay the timeout;
		// Redis has taken up to ~2 s to decide everything again after.
		{"bandwidth 1KB/s", "bandwidth", "downstream", map[string]any{"rate": 1}, false, 3 * time.Second},
		// Half-open: data vanishes, the connection stays open (no FIN, no RST).
		{"half-open", "timeout", "upstream", map[string]any{"timeout": 0}, true, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// A private server: the shared one's other traffic would blur
			// when Redis is back.
			srv := testenv.StartRedis(t)
			proxy := testenv.StartToxiproxy(t, srv.Addr())
			client, err := limiter.NewClient(proxy.Addr())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { client.Close() })
			direct, err := limiter.NewClient(srv.URL())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { direct.Close() })
			store := newNodeStore(client)
			var removed time.Time
			settle := tt.settle
			if settle == 0 {
				settle = 2 * time.Second
			}
			run := runFault(t, store, func() {
				proxy.AddToxic("fault", tt.typ, tt.stream, tt.attrs)
			}, func() {
				time.Sleep(fault)
				proxy.RemoveToxic("fault")
				removed = time.Now()
			}, settle)
			window, undecided := run.check(t)
			lost, extra, admitted := store.counts(t, direct)
			during := run.during(fault)
			t.Logf("%s: p99 %v over %d checks during the fault; breaker opened %d times; window of errors %v (%d checks answered by their failure mode), ending %v after the fault was removed; %d of %d admitted hits lost, %d counted but answered by the failure mode",
				tt.name, p99(during), len(during), run.trips, window.Round(time.Millisecond), undecided,
				run.cut.Add(window).Sub(removed).Round(time.Millisecond), lost, admitted, extra)
			if tt.trips && run.trips == 0 {
				t.Errorf("breaker never opened")
			}
			// The store timeout bounds every check (plus scheduling on a
			// loaded 2-core machine).
			if got, bound := p99(during), limiter.DefaultTimeout+25*time.Millisecond; got > bound {
				t.Errorf("p99 during the fault %v, want at most the store timeout + 25ms (%v)", got, bound)
			}
			if lost > 0 {
				t.Errorf("%d hits Redis admitted are not counted", lost)
			}
		})
	}
}
