package middleware_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/enforcer/middleware"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

// benchYAML limits per user far above what a benchmark reaches, so every
// request is a real Take in Redis and is let through.
const benchYAML = `domain: app
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000000}
`

// BenchmarkNodeHandler measures a Node's Limiter on the request path against
// the real Redis: many requests in flight at once (64 per CPU, as an app
// server has), each for one of 1000 users. The Node is built as an app
// builds it, with NewNode; no console is needed, the ruleset is applied
// directly.
func BenchmarkNodeHandler(b *testing.B) {
	n, err := middleware.NewNode(middleware.NodeConfig{
		ConsoleURL: "http://127.0.0.1:1", // never dialled: Run is not called
		RedisURL:   testenv.RedisURL(b),
		KeyPrefix:  testenv.KeyPrefix(b),
		NodeID:     "bench",
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { n.Close() })
	d, err := rules.Parse("app.yaml", []byte(benchYAML))
	if err != nil {
		b.Fatal(err)
	}
	set, err := rules.Compile([]*rules.Domain{d})
	if err != nil {
		b.Fatal(err)
	}
	n.Engine().Apply(1, set)
	l, err := n.Limiter(middleware.Config{
		Domain:      "app",
		Descriptors: []rules.RequestDescriptor{{Entries: []rules.RequestEntry{{Key: "user", From: rules.FromHeader, Name: "X-User"}}}},
	})
	if err != nil {
		b.Fatal(err)
	}
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	var seq, limited atomic.Int64
	b.SetParallelism(64)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-User", "u"+strconv.FormatInt(seq.Add(1)%1000, 10))
		for pb.Next() {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != http.StatusOK {
				limited.Add(1)
			}
		}
	})
	if limited.Load() > 0 {
		b.Fatalf("%d requests not let through", limited.Load())
	}
}
