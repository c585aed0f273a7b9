package hub

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/internal/testenv"
)

// TestPlanReadGivesUpOnStalledPostgres: while Postgres stops answering, a
// connecting node's plan read fails after the hub's plan timeout instead of
// holding planMu; once Postgres answers again the next read succeeds.
func TestPlanReadGivesUpOnStalledPostgres(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u, err := url.Parse(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.StartToxiproxy(t, u.Host)
	u.Host = proxy.Addr()
	st, err := store.Open(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	v, err := st.Publish(ctx, store.Change{Domain: "api", Message: "m", Actor: store.Actor{Name: "t"},
		YAML: "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"})
	if err != nil {
		t.Fatal(err)
	}
	h := New(st, nil)
	h.planTimeout = 300 * time.Millisecond

	// Data from Postgres is dropped, on open connections and new ones,
	// until the toxic goes.
	proxy.AddToxic("stall", "timeout", "downstream", map[string]any{"timeout": 0})
	done := make(chan error, 1)
	go func() {
		_, err := h.planSince(ctx, h.gen.Load())
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the plan read through a stalled Postgres succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the plan read still holds planMu 10s into the stall")
	}

	proxy.RemoveToxic("stall")
	p, err := h.planSince(ctx, h.gen.Load())
	if err != nil {
		t.Fatalf("plan read after the stall: %v", err)
	}
	if p.state.Head != v || p.head.version != v {
		t.Errorf("plan after the stall: head %d (snapshot %d), want %d", p.state.Head, p.head.version, v)
	}
}
