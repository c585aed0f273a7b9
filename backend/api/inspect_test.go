package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/api"
	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

const supportYAML = `domain: shop
descriptors:
  - key: token_bucket
    algorithm: token_bucket
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: leaky_bucket
    algorithm: leaky_bucket
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: fixed_window
    algorithm: fixed_window
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: sliding_window_log
    algorithm: sliding_window_log
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: sliding_window_counter
    algorithm: sliding_window_counter
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: customer
    rate_limit: {unit: hour, requests_per_unit: 1000, name: per-customer}
    shards: 3
    descriptors:
      - key: route
        value: /search
        rate_limit: {unit: hour, requests_per_unit: 20, name: search}
        shadow_mode: true
`

type inspection struct {
	Version int64 `json:"version"`
	Limits  []struct {
		Descriptor      int       `json:"descriptor"`
		Rule            string    `json:"rule"`
		Algorithm       string    `json:"algorithm"`
		RequestsPerUnit int64     `json:"requests_per_unit"`
		Unit            string    `json:"unit"`
		Used            int64     `json:"used"`
		Remaining       int64     `json:"remaining"`
		ResetAt         time.Time `json:"reset_at"`
		Capacity        int64     `json:"capacity"`
		ShadowMode      bool      `json:"shadow_mode"`
		Shards          int       `json:"shards"`
	} `json:"limits"`
}

// supportFixture is a fixture with supportYAML published and an enforcer's
// engine counting in the same store, under the same prefix.
func supportFixture(t *testing.T) (*fixture, *engine.Engine) {
	t.Helper()
	f := newFixture(t)
	v, err := f.store.Publish(context.Background(), store.Change{Domain: "shop", YAML: supportYAML, Message: "m", Actor: sys})
	if err != nil {
		t.Fatal(err)
	}
	d, err := rules.Parse("shop.yaml", []byte(supportYAML))
	if err != nil {
		t.Fatal(err)
	}
	set, err := rules.Compile([]*rules.Domain{d})
	if err != nil {
		t.Fatal(err)
	}
	node := engine.New(f.counters, f.keyPrefix, engine.WithoutStats())
	if err := node.Apply(v, set); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Delete what the checks counted (the engine's own Reset).
		for _, k := range []string{"token_bucket", "leaky_bucket", "fixed_window", "sliding_window_log", "sliding_window_counter", "customer"} {
			for _, v := range []string{k + "-a", k + "-b", "c1", "c2"} {
				if ins, err := node.Limits(checkRequest(descriptor(k, v), descriptor("customer", v, "route", "/search"))); err == nil {
					_, _ = node.Reset(context.Background(), ins)
				}
			}
		}
	})
	return f, node
}

func descriptor(kv ...string) []rules.Entry {
	var es []rules.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, rules.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}

func checkRequest(ds ...[]rules.Entry) engine.Request {
	r := engine.Request{Domain: "shop"}
	for _, d := range ds {
		r.Descriptors = append(r.Descriptors, engine.Descriptor{Entries: d})
	}
	return r
}

// inspectBody is the JSON body of an inspect of ds in shop.
func inspectBody(extra string, ds ...[]rules.Entry) string {
	type entry struct {
		Key   string `json:"key"`
		Value string `json:"value"`
	}
	type desc struct {
		Entries []entry `json:"entries"`
	}
	var out []desc
	for _, d := range ds {
		var es []entry
		for _, e := range d {
			es = append(es, entry{e.Key, e.Value})
		}
		out = append(out, desc{es})
	}
	b, _ := json.Marshal(map[string]any{"domain": "shop", "descriptors": out})
	if extra != "" {
		return strings.TrimSuffix(string(b), "}") + "," + extra + "}"
	}
	return string(b)
}

func nodeCheck(t *testing.T, node *engine.Engine, r engine.Request) engine.Result {
	t.Helper()
	res, err := node.Check(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	if res.StoreErr != nil {
		t.Fatalf("check: store failed: %v", res.StoreErr)
	}
	return res
}

// TestInspectAPI: for every algorithm, three checks by an enforcer's
// engine, then the console's inspect says 3 used, twice alike, and the
// fourth check decides as for a value nobody inspected.
func TestInspectAPI(t *testing.T) {
	t.Parallel()
	f, node := supportFixture(t)
	for _, alg := range []string{"token_bucket", "leaky_bucket", "fixed_window", "sliding_window_log", "sliding_window_counter"} {
		t.Run(alg, func(t *testing.T) {
			a, b := checkRequest(descriptor(alg, alg+"-a")), checkRequest(descriptor(alg, alg+"-b"))
			for range 3 {
				nodeCheck(t, node, a)
				nodeCheck(t, node, b)
			}
			var first inspection
			for i := range 2 {
				var got inspection
				f.decodeJSON(t, "POST", "/api/v1/inspect", "viewer", inspectBody("", descriptor(alg, alg+"-a")), 200, &got)
				if got.Version != 1 || len(got.Limits) != 1 {
					t.Fatalf("inspect = %+v, want one limit of version 1", got)
				}
				l := got.Limits[0]
				if l.Rule != alg || l.Algorithm != alg || l.Used != 3 || l.Remaining != 7 || l.Capacity != 10 || l.RequestsPerUnit != 10 || l.Shards != 1 {
					t.Errorf("inspect %d = %+v, want rule and algorithm %s, 3 used, 7 remaining", i, l, alg)
				}
				if l.ResetAt.Before(time.Now().Add(-time.Second)) || l.ResetAt.After(time.Now().Add(2*time.Hour+time.Minute)) {
					t.Errorf("reset_at %v, want within the limit's window from now", l.ResetAt)
				}
				if i == 0 {
					first = got
				} else if got.Limits[0].Used != first.Limits[0].Used || got.Limits[0].Remaining != first.Limits[0].Remaining {
					t.Errorf("second inspect %+v, first %+v", got.Limits[0], first.Limits[0])
				}
			}
			ra, rb := nodeCheck(t, node, a), nodeCheck(t, node, b)
			if ra.Code != rb.Code || ra.Statuses[0].Remaining != rb.Statuses[0].Remaining || ra.Statuses[0].Remaining != 6 {
				t.Errorf("fourth check: inspected %+v, never inspected %+v; want both with 6 remaining", ra.Statuses[0], rb.Statuses[0])
			}
		})
	}
}

// TestInspectHierarchy: a request of two descriptors lists both limits in
// order; the sharded one is summed over its shards, the shadow one says so.
func TestInspectHierarchy(t *testing.T) {
	t.Parallel()
	f, node := supportFixture(t)
	r := checkRequest(descriptor("customer", "c1"), descriptor("customer", "c1", "route", "/search"), descriptor("nothing", "x"))
	for range 5 {
		nodeCheck(t, node, r)
	}
	var got inspection
	f.decodeJSON(t, "POST", "/api/v1/inspect", "viewer",
		inspectBody("", descriptor("customer", "c1"), descriptor("customer", "c1", "route", "/search"), descriptor("nothing", "x")), 200, &got)
	if len(got.Limits) != 2 {
		t.Fatalf("inspect = %+v, want two limits", got)
	}
	per, search := got.Limits[0], got.Limits[1]
	if per.Descriptor != 0 || per.Rule != "per-customer" || per.Shards != 3 || per.Used != 5 || per.Remaining != 995 {
		t.Errorf("per-customer = %+v, want descriptor 0, 5 used over 3 shards", per)
	}
	if search.Descriptor != 1 || search.Rule != "search" || !search.ShadowMode || search.Used != 5 || search.Unit != "hour" {
		t.Errorf("search = %+v, want descriptor 1, shadow mode, 5 used", search)
	}
}

// TestResetAPI: a support person resets one customer's counters: audited
// with the descriptor and the message, the other customer's untouched.
func TestResetAPI(t *testing.T) {
	t.Parallel()
	f, node := supportFixture(t)
	d1 := []rules.Entry{{Key: "customer", Value: "c1"}, {Key: "route", Value: "/search"}}
	for _, v := range []string{"c1", "c2"} {
		for range 4 {
			nodeCheck(t, node, checkRequest(descriptor("customer", v), descriptor("customer", v, "route", "/search")))
		}
	}
	if status, body := f.call(t, "POST", "/api/v1/inspect/reset", "viewer", inspectBody(`"message":"ticket 42"`, d1)); status != 403 {
		t.Errorf("viewer's reset = %d %s, want 403", status, body)
	}
	if status, body := f.call(t, "POST", "/api/v1/inspect/reset", "support", inspectBody("", d1)); status != 400 || !strings.Contains(body, "message") {
		t.Errorf("reset without a message = %d %s, want 400 naming it", status, body)
	}
	var res struct {
		Version int64 `json:"version"`
		Limits  []struct {
			Descriptor int    `json:"descriptor"`
			Rule       string `json:"rule"`
		} `json:"limits"`
		Keys int64 `json:"keys"`
	}
	f.decodeJSON(t, "POST", "/api/v1/inspect/reset", "support",
		inspectBody(`"message":"ticket 42: launch today"`, descriptor("customer", "c1"), d1), 200, &res)
	if res.Version != 1 || len(res.Limits) != 2 || res.Limits[0].Rule != "per-customer" || res.Limits[1].Rule != "search" || res.Keys != 4 {
		t.Errorf("reset = %+v, want both limits, 4 keys (3 shards and the search limit)", res)
	}
	for v, want := range map[string]int64{"c1": 0, "c2": 4} {
		var got inspection
		f.decodeJSON(t, "POST", "/api/v1/inspect", "viewer", inspectBody("", descriptor("customer", v), descriptor("customer", v, "route", "/search")), 200, &got)
		for _, l := range got.Limits {
			if l.Used != want {
				t.Errorf("after the reset of c1, %s's %s: used %d, want %d", v, l.Rule, l.Used, want)
			}
		}
	}

	var audit struct {
		Events []store.AuditEvent `json:"events"`
	}
	f.decodeJSON(t, "GET", "/api/v1/audit?action=counter.reset", "viewer", "", 200, &audit)
	if len(audit.Events) != 1 {
		t.Fatalf("counter.reset events = %+v, want one", audit.Events)
	}
	ev := audit.Events[0]
	after := string(ev.After)
	if ev.Target != "domain:shop" || ev.Message != "ticket 42: launch today" || !strings.HasPrefix(ev.Actor, "token:support") ||
		!strings.Contains(after, `"value":"/search"`) || !strings.Contains(after, `"value":"c1"`) || !strings.Contains(after, `"rule":"search"`) {
		t.Errorf("audit event = %+v (after %s), want the descriptors, the limits and the message", ev, after)
	}
	if status, body := f.call(t, "GET", "/api/v1/audit/verify", "viewer", ""); !strings.Contains(body, `"ok":true`) {
		t.Errorf("audit chain: %d %s", status, body)
	}

	// A descriptor that matches no counted limit: nothing to reset, nothing audited.
	if status, body := f.call(t, "POST", "/api/v1/inspect/reset", "editor", inspectBody(`"message":"m"`, descriptor("nothing", "x"))); status != 422 {
		t.Errorf("reset of no limit = %d %s, want 422", status, body)
	}
}

// TestInspectBadInput: unknown domain 404, NUL, invalid UTF-8 and 10,000
// entries 400, and a console without a counter store 503.
func TestInspectBadInput(t *testing.T) {
	t.Parallel()
	f, _ := supportFixture(t)
	many := make([]string, 10_000)
	for i := range many {
		many[i] = fmt.Sprintf(`{"key":"k%d","value":"v"}`, i)
	}
	tests := []struct {
		name, path, body string
		want             int
		fragment         string
	}{
		{"unknown domain", "/api/v1/inspect", `{"domain":"nope","descriptors":[{"entries":[{"key":"a","value":"b"}]}]}`, 404, `domain \"nope\"`},
		{"unknown domain reset", "/api/v1/inspect/reset", `{"domain":"nope","descriptors":[{"entries":[{"key":"a","value":"b"}]}],"message":"m"}`, 404, "not_found"},
		{"NUL", "/api/v1/inspect", `{"domain":"shop","descriptors":[{"entries":[{"key":"customer","value":"a\u0000b"}]}]}`, 400, "NUL"},
		{"NUL reset", "/api/v1/inspect/reset", `{"domain":"shop","descriptors":[{"entries":[{"key":"customer\u0000","value":"a"}]}],"message":"m"}`, 400, "NUL"},
		{"invalid UTF-8", "/api/v1/inspect", "{\"domain\":\"shop\",\"descriptors\":[{\"entries\":[{\"key\":\"customer\",\"value\":\"\xff\"}]}]}", 400, "UTF-8"},
		{"10,000 entries", "/api/v1/inspect", `{"domain":"shop","descriptors":[{"entries":[` + strings.Join(many, ",") + `]}]}`, 400, "10000 entries"},
		{"10,000 entries reset", "/api/v1/inspect/reset", `{"domain":"shop","descriptors":[{"entries":[` + strings.Join(many, ",") + `]}],"message":"m"}`, 400, "entries"},
		{"no descriptors", "/api/v1/inspect", `{"domain":"shop","descriptors":[]}`, 400, "descriptors"},
		{"unknown field", "/api/v1/inspect", `{"domain":"shop","descriptors":[],"hits":1}`, 400, "hits"},
		{"not JSON", "/api/v1/inspect", `{"domain":`, 400, "invalid JSON"},
	}
	for _, tt := range tests {
		status, body := f.call(t, "POST", tt.path, "admin", tt.body)
		if status != tt.want || !strings.Contains(body, tt.fragment) {
			t.Errorf("%s: %d %s, want %d with %q", tt.name, status, excerpt(body), tt.want, tt.fragment)
		}
	}

	none := newFixture(t, func(c *api.Config) { c.Counters = nil })
	if _, err := none.store.Publish(context.Background(), store.Change{Domain: "shop", YAML: supportYAML, Message: "m", Actor: sys}); err != nil {
		t.Fatal(err)
	}
	for path, extra := range map[string]string{"/api/v1/inspect": "", "/api/v1/inspect/reset": `"message":"m"`} {
		status, body := none.call(t, "POST", path, "admin", inspectBody(extra, descriptor("customer", "c1")))
		if status != 503 || !strings.Contains(body, "--redis-url") {
			t.Errorf("%s without a counter store = %d %s, want 503 naming --redis-url", path, status, body)
		}
	}
	if status, body := none.call(t, "GET", "/api/v1/audit?action=counter.reset", "admin", ""); status != 200 || strings.Contains(body, "counter.reset") {
		t.Errorf("a refused reset was audited: %s", body)
	}
}

// TestResetStoreDown: when the counter store does not answer, inspect and
// reset are 503 and the reset is not audited.
func TestResetStoreDown(t *testing.T) {
	t.Parallel()
	client, err := limiter.NewClient("redis://127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)) + "/0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	f := newFixture(t, func(c *api.Config) { c.Counters = limiter.NewRedis(client) })
	if _, err := f.store.Publish(context.Background(), store.Change{Domain: "shop", YAML: supportYAML, Message: "m", Actor: sys}); err != nil {
		t.Fatal(err)
	}
	for path, extra := range map[string]string{"/api/v1/inspect": "", "/api/v1/inspect/reset": `"message":"m"`} {
		status, body := f.call(t, "POST", path, "support", inspectBody(extra, descriptor("customer", "c1")))
		if status != 503 || !strings.Contains(body, "counter_store_unavailable") || strings.Contains(body, "127.0.0.1") {
			t.Errorf("%s with the store down = %d %s, want 503 without the internal error", path, status, body)
		}
	}
	if _, body := f.call(t, "GET", "/api/v1/audit?action=counter.reset", "admin", ""); strings.Contains(body, "counter.reset") {
		t.Errorf("a failed reset was audited: %s", body)
	}
	if _, body := f.call(t, "GET", "/api/v1/audit/verify", "viewer", ""); !strings.Contains(body, `"ok":true`) {
		t.Errorf("audit chain: %s", body)
	}
}

// TestInspectOverride: a customer with an active override is inspected
// against the override's rate, as the nodes enforce it, and against the
// domain's own limit again once it ends.
func TestInspectOverride(t *testing.T) {
	t.Parallel()
	f, node := supportFixture(t)
	c := checkRequest(descriptor("fixed_window", "c1"))
	for range 3 {
		nodeCheck(t, node, c)
	}
	rate := func(want int64) {
		t.Helper()
		var got inspection
		f.decodeJSON(t, "POST", "/api/v1/inspect", "viewer", inspectBody("", descriptor("fixed_window", "c1")), 200, &got)
		if len(got.Limits) != 1 || got.Limits[0].RequestsPerUnit != want || got.Limits[0].Used != 3 || got.Limits[0].Remaining != want-3 {
			t.Fatalf("inspect = %+v, want %d requests per unit, 3 used", got, want)
		}
	}
	rate(10)
	body := fmt.Sprintf(`{"domain":"shop","entries":[{"key":"fixed_window","value":"c1"}],"rate_limit":{"unit":"hour","requests_per_unit":50},"expires_at":%q,"message":"ticket 7"}`,
		time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	var created struct {
		ID int64 `json:"id"`
	}
	f.decodeJSON(t, "POST", "/api/v1/overrides", "editor", body, 201, &created)
	rate(50)
	if status, out := f.call(t, "DELETE", fmt.Sprintf("/api/v1/overrides/%d", created.ID), "editor", `{"message":"done"}`); status != 200 {
		t.Fatalf("end override: %d %s", status, out)
	}
	rate(10)
}
