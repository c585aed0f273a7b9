package middleware_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/enforcer/middleware"
	"github.com/sluicehq/sluice/rules"
)

// TestMaxWaiting: a delay limit holds requests only while fewer than
// Config.MaxWaiting are held; beyond that it rejects at once.
func TestMaxWaiting(t *testing.T) {
	eng := newEngine(t)
	d, err := rules.Parse("app.yaml", []byte(`domain: app
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1, name: slow}
    on_limit: {action: delay, max_delay: 5s}
`))
	if err != nil {
		t.Fatal(err)
	}
	set, err := rules.Compile([]*rules.Domain{d})
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.Apply(1, set); err != nil {
		t.Fatal(err)
	}
	lim, err := middleware.New(eng, middleware.Config{Domain: "app", MaxWaiting: 1})
	if err != nil {
		t.Fatal(err)
	}
	h := lim.Handler(hello)

	if w := get(t, h, "192.0.2.1:1"); w.Code != 200 {
		t.Fatalf("1st request: %d, want 200 at once", w.Code)
	}
	held := make(chan int, 1)
	go func() { held <- get(t, h, "192.0.2.1:1").Code }()
	for deadline := time.Now().Add(5 * time.Second); lim.Waiting() != 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("2nd request not held within 5s")
		}
	}
	began := time.Now()
	if w := get(t, h, "192.0.2.1:1"); w.Code != 429 || time.Since(began) > 500*time.Millisecond {
		t.Errorf("3rd request with one held (MaxWaiting 1): %d after %v, want 429 at once", w.Code, time.Since(began))
	}
	if code := <-held; code != 200 {
		t.Errorf("held request: %d, want 200 once the bucket let it through", code)
	}
}
