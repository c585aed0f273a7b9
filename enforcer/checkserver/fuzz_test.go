package checkserver

import (
	"bytes"
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/rules"
)

// FuzzCheckBody feeds HTTP check bodies (POST /json and /v1/check) through
// the whole decision path an outside client reaches: protojson decoding,
// conversion (overrides included) and the engine, on an in-process store.
// No input may panic; every refusal is an invalid request.
func FuzzCheckBody(f *testing.F) {
	for _, s := range []string{
		`{"domain":"api","descriptors":[{"entries":[{"key":"api_key","value":"k1"}]}],"hitsAddend":1}`,
		`{"domain":"api","descriptors":[{"entries":[{"key":"api_key","value":"k1"}],"limit":{"requestsPerUnit":5,"unit":"YEAR"},"hitsAddend":3}]}`,
		`{"domain":"api","descriptors":[{"entries":[{"key":"api_key","value":"k"}],"limit":{"requestsPerUnit":1,"unit":"SECOND","unitMultiplier":4294967295}}]}`,
		`{"domain":"api","descriptors":[{"entries":[]},{"isNegativeHits":true}]}`,
		`{"domain":"","descriptors":[]}`, `{}`, `[]`, `{"domain":"api\u0000"}`, "\xff",
	} {
		f.Add([]byte(s))
	}
	d, err := rules.Parse("api.yaml", []byte("domain: api\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"))
	if err != nil {
		f.Fatal(err)
	}
	set, err := rules.Compile([]*rules.Domain{d})
	if err != nil {
		f.Fatal(err)
	}
	eng := engine.New(limiter.NewLocal(limiter.LocalOptions{MaxKeys: 10_000}), "fuzz:")
	if err := eng.Apply(1, set); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r := httptest.NewRequest("POST", "/v1/check", strings.NewReader(string(body)))
		msg, status, _, _ := readRequest(httptest.NewRecorder(), r)
		if msg == nil {
			if status < 400 || status > 499 {
				t.Fatalf("refused with status %d", status)
			}
			return
		}
		req, err := toRequest(msg)
		if err != nil {
			return
		}
		res, err := eng.Check(context.Background(), req)
		if err == nil && len(res.Statuses) != len(req.Descriptors) {
			t.Fatalf("%d statuses for %d descriptors", len(res.Statuses), len(req.Descriptors))
		}
	})
}

// FuzzScanBounds holds the streaming scan of large check bodies to what
// decoding them whole decides: it never panics, and it refuses a body only
// when protojson would fail on it or the engine would refuse it for its
// descriptor or entry count.
func FuzzScanBounds(f *testing.F) {
	many := func(n, e int) string {
		d := `{"entries":[` + strings.TrimSuffix(strings.Repeat(`{"key":"k","value":"v"},`, e), ",") + `]}`
		return `{"domain":"api","descriptors":[` + strings.TrimSuffix(strings.Repeat(d+",", n), ",") + `]}`
	}
	for _, s := range []string{
		many(64, 1), many(65, 1), many(1, 32), many(1, 33), many(2, 40),
		`{"descr\u0069ptors":[` + strings.Repeat(`{},`, 70) + `{}]}`,
		`{"domain":"api","descriptors":null}`, `[[[],[]]]`, `{"a":{"descriptors":[` + strings.Repeat(`1,`, 70) + `1]}}`,
		`{"descriptors":[[` + strings.Repeat(`{},`, 70) + `{}]]}`, `{"descriptors":[{"entries":{"a":1}}]}`, `{`, `"x"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		err := scanBounds(bytes.NewReader(body))
		if !errors.Is(err, engine.ErrInvalidRequest) {
			return
		}
		msg := new(rlsv3.RateLimitRequest)
		if jsonIn.Unmarshal(body, msg) != nil {
			return
		}
		over := len(msg.Descriptors) > engine.MaxDescriptors
		for _, d := range msg.Descriptors {
			over = over || len(d.Entries) > engine.MaxEntries
		}
		if !over {
			t.Fatalf("scan refused (%v) a body protojson decodes within the bounds", err)
		}
	})
}
