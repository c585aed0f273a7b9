package engine_test

import (
	"context"
	"errors"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

const inspectYAML = `domain: api
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
  - key: sharded
    rate_limit: {unit: hour, requests_per_unit: 10}
    shards: 4
  - key: shadow
    rate_limit: {unit: hour, requests_per_unit: 10}
    shadow_mode: true
  - key: org
    rate_limit: {unit: hour, requests_per_unit: 100, name: per-org}
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 10, name: per-org-user}
  - key: free
    rate_limit: {unlimited: true}
`

// inspectEngine returns an engine on the test Redis under a prefix of its
// own, with inspectYAML as version 7, and the client to look at the keys.
func inspectEngine(t *testing.T, url string) (*engine.Engine, redis.UniversalClient, string) {
	t.Helper()
	client, err := limiter.NewClient(url, limiter.WithTimeout(2*time.Second), limiter.WithDialTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	prefix := testenv.KeyPrefix(t)
	eng := engine.New(limiter.NewRedis(client), prefix)
	if err := eng.Apply(7, compile(t, inspectYAML)); err != nil {
		t.Fatal(err)
	}
	return eng, client, prefix
}

// dumpStore returns the DUMP of every key matching match in the store: on
// a cluster, from every master.
func dumpStore(t *testing.T, c redis.UniversalClient, match string) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	var mu sync.Mutex // ForEachMaster scans the masters in parallel
	scan := func(ctx context.Context, n redis.UniversalClient) error {
		iter := n.Scan(ctx, 0, match, 1000).Iterator()
		for iter.Next(ctx) {
			k := iter.Val()
			v, err := n.Dump(ctx, k).Result()
			if err != nil {
				return err
			}
			mu.Lock()
			out[k] = v
			mu.Unlock()
		}
		return iter.Err()
	}
	var err error
	if cc, ok := c.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return scan(ctx, n) })
	} else {
		err = scan(ctx, c)
	}
	if err != nil {
		t.Fatalf("dump store: %v", err)
	}
	return out
}

func TestInspect(t *testing.T) {
	t.Parallel()
	testInspect(t, testenv.RedisURL(t))
}

func TestInspectCluster(t *testing.T) {
	t.Parallel()
	testInspect(t, testenv.StartCluster(t, 3, 0, 2*time.Second).Seeds())
}

// testInspect: for every algorithm (and a sharded, a shadow and a nested
// limit), three checks, then Inspect reports 3 used twice alike, the store
// is the same byte for byte, and the fourth check decides as for a value
// that was never inspected. Reset then starts one value afresh and leaves
// the other's counters alone.
func testInspect(t *testing.T, url string) {
	eng, client, prefix := inspectEngine(t, url)
	ctx := context.Background()
	cases := []struct {
		name    string
		request func(v string) engine.Request
		rules   []string
		shards  int
	}{
		{name: "token_bucket"}, {name: "leaky_bucket"}, {name: "fixed_window"},
		{name: "sliding_window_log"}, {name: "sliding_window_counter"},
		{name: "sharded", shards: 4},
		{name: "shadow"},
		{name: "nested", request: func(v string) engine.Request {
			return req(entry("org", v), []rules.Entry{{Key: "org", Value: v}, {Key: "user", Value: "u1"}})
		}, rules: []string{"per-org", "per-org-user"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			request := tc.request
			if request == nil {
				request = func(v string) engine.Request { return req(entry(tc.name, v)) }
			}
			names := tc.rules
			if names == nil {
				names = []string{tc.name}
			}
			shards := max(tc.shards, 1)
			a, b := request(tc.name+"-a"), request(tc.name+"-b")
			for range 3 {
				for _, r := range []engine.Request{a, b} {
					if res := check(t, eng, r); res.Code != engine.OK {
						t.Fatalf("check %+v: %v", r, res.Code)
					}
				}
			}
			before := dumpStore(t, client, prefix+"*")
			if len(before) == 0 {
				t.Fatal("no keys in the store after three checks")
			}
			var first engine.Inspection
			for i := range 2 {
				ins, err := eng.Inspect(ctx, a)
				if err != nil {
					t.Fatalf("Inspect: %v", err)
				}
				if ins.Version != 7 || len(ins.Limits) != len(names) {
					t.Fatalf("Inspect = version %d, %d limits; want 7 and %v", ins.Version, len(ins.Limits), names)
				}
				for j, l := range ins.Limits {
					if l.Descriptor != j || l.Limit.Name != names[j] {
						t.Errorf("limit %d = descriptor %d rule %q, want %d %q", j, l.Descriptor, l.Limit.Name, j, names[j])
					}
					if l.Used != 3 || l.Remaining != l.Capacity-3 {
						t.Errorf("limit %s: used %d remaining %d of %d, want 3 used", l.Limit.Name, l.Used, l.Remaining, l.Capacity)
					}
					if l.Shards != shards && l.Limit.Name == names[len(names)-1] {
						t.Errorf("limit %s: %d shards, want %d", l.Limit.Name, l.Shards, shards)
					}
					if l.ResetAfter <= 0 || time.Since(l.At).Abs() > time.Minute {
						t.Errorf("limit %s: reset after %v at %v, want a reset ahead, read at the store's now", l.Limit.Name, l.ResetAfter, l.At)
					}
				}
				if i == 0 {
					first = ins
				} else {
					for j := range ins.Limits {
						if ins.Limits[j].Used != first.Limits[j].Used || ins.Limits[j].Remaining != first.Limits[j].Remaining {
							t.Errorf("second inspection %+v, first %+v", ins.Limits[j], first.Limits[j])
						}
					}
				}
			}
			if after := dumpStore(t, client, prefix+"*"); !maps.Equal(before, after) {
				t.Errorf("the store changed while inspecting: %d keys before, %d after", len(before), len(after))
			}
			ra, rb := check(t, eng, a), check(t, eng, b)
			for j := range ra.Statuses {
				sa, sb := ra.Statuses[j], rb.Statuses[j]
				if sa.Code != sb.Code || sa.Remaining != sb.Remaining || sa.Shadowed != sb.Shadowed {
					t.Errorf("fourth check, descriptor %d: inspected %+v, never inspected %+v", j, sa, sb)
				}
			}

			ins, err := eng.Limits(a)
			if err != nil {
				t.Fatal(err)
			}
			n, err := eng.Reset(ctx, ins)
			if err != nil || n < int64(len(names)) {
				t.Fatalf("Reset = %d, %v; want at least %d keys deleted", n, err, len(names))
			}
			got, err := eng.Inspect(ctx, a)
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range got.Limits {
				if l.Used != 0 {
					t.Errorf("after Reset, %s: used %d, want 0", l.Limit.Name, l.Used)
				}
			}
			got, err = eng.Inspect(ctx, b)
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range got.Limits {
				if l.Used != 4 {
					t.Errorf("another value after Reset, %s: used %d, want its 4 untouched", l.Limit.Name, l.Used)
				}
			}
		})
	}
}

func TestInspectEdges(t *testing.T) {
	t.Parallel()
	eng, _, _ := inspectEngine(t, testenv.RedisURL(t))
	ctx := context.Background()

	// Unlimited, no match and a 10,000-entry descriptor.
	ins, err := eng.Inspect(ctx, req(entry("free", "x"), entry("nothing", "x"), entry("token_bucket", "x")))
	if err != nil {
		t.Fatal(err)
	}
	if len(ins.Limits) != 2 || !ins.Limits[0].Limit.Unlimited || ins.Limits[0].Counted() || ins.Limits[1].Descriptor != 2 {
		t.Errorf("Inspect = %+v, want the unlimited limit (no counter) and descriptor 2's", ins.Limits)
	}
	if ins.Limits[1].Used != 0 || ins.Limits[1].Remaining != 10 {
		t.Errorf("a value never seen: %+v, want 10 remaining", ins.Limits[1])
	}
	many := make([]rules.Entry, 10_000)
	for i := range many {
		many[i] = rules.Entry{Key: "k", Value: strings.Repeat("v", 3)}
	}
	if _, err := eng.Inspect(ctx, req(many)); !errors.Is(err, engine.ErrInvalidRequest) {
		t.Errorf("10,000 entries: %v, want ErrInvalidRequest", err)
	}
	if _, err := eng.Inspect(ctx, engine.Request{Domain: "nope", Descriptors: []engine.Descriptor{{Entries: entry("a", "b")}}}); !errors.Is(err, engine.ErrUnknownDomain) {
		t.Errorf("unknown domain: %v, want ErrUnknownDomain", err)
	}
	if _, err := engine.New(nil, "").Inspect(ctx, req(entry("a", "b"))); !errors.Is(err, engine.ErrNoRuleset) {
		t.Errorf("no ruleset: %v", err)
	}
	// Lyft's replaces: the replaced limit is left out, as Check leaves it out.
	repl := engine.New(nil, "")
	if err := repl.Apply(2, compile(t, `domain: api
descriptors:
  - key: route
    rate_limit: {unit: minute, requests_per_unit: 1, name: default-route}
  - key: vip
    rate_limit:
      unit: minute
      requests_per_unit: 5
      name: vip
      replaces: [{name: default-route}]
`)); err != nil {
		t.Fatal(err)
	}
	if ins, err := repl.Limits(req(entry("route", "/a"), entry("vip", "v1"))); err != nil || len(ins.Limits) != 1 || ins.Limits[0].Limit.Name != "vip" || ins.Limits[0].Descriptor != 1 {
		t.Errorf("Limits with a replacing limit = %+v, %v; want vip alone", ins.Limits, err)
	}
	noStore := engine.New(nil, "")
	if err := noStore.Apply(1, compile(t, inspectYAML)); err != nil {
		t.Fatal(err)
	}
	if _, err := noStore.Inspect(ctx, req(entry("token_bucket", "x"))); !errors.Is(err, engine.ErrNoCounters) {
		t.Errorf("no store: %v, want ErrNoCounters", err)
	}
}

// FuzzLimits: any descriptors either match (each limit from a descriptor of
// the request, with a key per shard) or are refused as invalid; never a
// panic.
func FuzzLimits(f *testing.F) {
	eng := engine.New(nil, "")
	set, err := rules.Parse("test.yaml", []byte(inspectYAML))
	if err != nil {
		f.Fatal(err)
	}
	cs, err := rules.Compile([]*rules.Domain{set})
	if err != nil {
		f.Fatal(err)
	}
	if err := eng.Apply(1, cs); err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{"org=o1;org=o1,user=u1", "sharded=x", "free=", "", "a\x00=b", "%{}:#=1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var r engine.Request
		r.Domain = "api"
		for _, d := range strings.Split(s, ";") {
			var es []rules.Entry
			for _, kv := range strings.Split(d, ",") {
				k, v, _ := strings.Cut(kv, "=")
				es = append(es, rules.Entry{Key: k, Value: v})
			}
			r.Descriptors = append(r.Descriptors, engine.Descriptor{Entries: es})
		}
		ins, err := eng.Limits(r)
		if err != nil {
			if !errors.Is(err, engine.ErrInvalidRequest) {
				t.Fatalf("Limits(%q): %v", s, err)
			}
			return
		}
		for _, l := range ins.Limits {
			if l.Descriptor < 0 || l.Descriptor >= len(r.Descriptors) || l.Limit == nil {
				t.Fatalf("Limits(%q): %+v", s, l)
			}
			if l.Counted() && len(l.Keys()) != max(int(l.Limit.Shards), 1) {
				t.Fatalf("Limits(%q): %d keys for %d shards", s, len(l.Keys()), l.Limit.Shards)
			}
		}
	})
}

// TestInspectLease: units a node leased count as used from the grant on,
// while the node spends them, until it gives the rest back.
func TestInspectLease(t *testing.T) {
	t.Parallel()
	client, err := limiter.NewClient(testenv.RedisURL(t), limiter.WithTimeout(2*time.Second), limiter.WithDialTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	r := limiter.NewRedis(client)
	eng := engine.New(r, testenv.KeyPrefix(t), engine.WithLeases(r, engine.LeaseOptions{MinRate: -1, Units: 20, MaxLifetime: time.Minute,
		Timeout: 2 * time.Second})) // a grant past the default 50 ms on a loaded machine would never come
	if err := eng.Apply(1, compile(t, `domain: api
descriptors:
  - key: hot
    algorithm: fixed_window
    rate_limit: {unit: hour, requests_per_unit: 1000}
    lease: true
`)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	hot := req(entry("hot", "k"))
	used := func() int64 {
		t.Helper()
		ins, err := eng.Inspect(ctx, hot)
		if err != nil || len(ins.Limits) != 1 {
			t.Fatalf("Inspect = %+v, %v", ins, err)
		}
		return ins.Limits[0].Used
	}
	t.Cleanup(func() {
		if ins, err := eng.Limits(hot); err == nil {
			_, _ = eng.Reset(context.Background(), ins)
		}
	})
	check(t, eng, hot) // counted in Redis; asks for a lease of 20
	deadline := time.Now().Add(10 * time.Second)
	for used() != 21 {
		if time.Now().After(deadline) {
			t.Fatalf("used %d, want 21 once the lease of 20 is granted", used())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for range 5 {
		check(t, eng, hot) // from the lease: Redis is not asked
	}
	if got := used(); got != 21 {
		t.Errorf("used while the lease is spent: %d, want 21 (the leased units counted from the grant)", got)
	}
	if err := eng.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got := used(); got != 6 {
		t.Errorf("used after the lease was given back: %d, want 6 (the checks)", got)
	}
}

// TestInspectLocalStore: an engine counting in process (limiter.Local)
// inspects and resets the same way.
func TestInspectLocalStore(t *testing.T) {
	t.Parallel()
	eng := engine.New(limiter.NewLocal(limiter.LocalOptions{}), "")
	if err := eng.Apply(1, compile(t, inspectYAML)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r := req(entry("sharded", "x"), entry("sliding_window_log", "x"))
	for range 3 {
		check(t, eng, r)
	}
	ins, err := eng.Inspect(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ins.Limits {
		if l.Used != 3 {
			t.Errorf("%s: used %d, want 3", l.Limit.Name, l.Used)
		}
	}
	if n, err := eng.Reset(ctx, ins); err != nil || n != 4 {
		t.Errorf("Reset = %d, %v; want the 3 shards and the log", n, err)
	}
	if ins, _ := eng.Inspect(ctx, r); ins.Limits[0].Used != 0 || ins.Limits[1].Used != 0 {
		t.Errorf("after Reset: %+v", ins.Limits)
	}
}
