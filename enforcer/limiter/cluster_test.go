package limiter

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/rules"
)

func TestSlot(t *testing.T) {
	// Values from the Redis Cluster specification and CLUSTER KEYSLOT.
	tests := []struct {
		key  string
		want int
	}{
		{"123456789", 12739}, // CRC16-XMODEM check value 0x31C3
		{"foo", 12182},
		{"{user1000}.following", Slot("user1000")},
		{"foo{}{bar}", Slot("foo{}{bar}")}, // empty tag: the whole key
		{"foo{{bar}}zap", Slot("{bar")},
		{"foo{bar}{zap}", Slot("bar")},
		{"", 0},
	}
	for _, tt := range tests {
		if got := Slot(tt.key); got != tt.want {
			t.Errorf("Slot(%q) = %d, want %d", tt.key, got, tt.want)
		}
	}
}

// TestCluster runs the engine against a real three-master Redis Cluster
// started for this test.
func TestCluster(t *testing.T) {
	seeds := startCluster(t)
	c, err := NewClient(seeds, WithTimeout(2*time.Second), WithDialTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		t.Fatalf("NewClient(%q) = %T, want a cluster client", seeds, c)
	}
	ctx := context.Background()
	// Slots are spread over the three masters: check Slot against the server.
	for _, key := range []string{"a", "sluice:{api:k=v}:tb", "{x}y", "plain"} {
		want, err := cc.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := Slot(key); int64(got) != want {
			t.Errorf("Slot(%q) = %d, CLUSTER KEYSLOT says %d", key, got, want)
		}
	}

	// Keys of one request on distinct slots (and so, mostly, nodes).
	key := func(name string) string { return Key("t:", "d", []rules.Entry{{Key: "k", Value: name}}) }
	spread := func(n int, tag string) []string {
		var keys []string
		seen := map[int]bool{}
		for i := 0; len(keys) < n; i++ {
			k := key(tag + strconv.Itoa(i))
			if s := Slot(k); !seen[s] {
				seen[s] = true
				keys = append(keys, k)
			}
		}
		return keys
	}

	for _, eng := range []struct {
		name string
		take func(context.Context, []Request) ([]Decision, error)
	}{
		{"direct", NewRedis(c).Take},
		{"batcher", NewBatcher(NewRedis(c), BatchOptions{}).Take},
	} {
		t.Run(eng.name+"/all or nothing across slots", func(t *testing.T) {
			keys := spread(3, eng.name+"aon")
			mk := func(k string, burst int64) Request {
				return Request{Key: k, Limit: 1, Period: time.Hour, Burst: burst, Hits: 1}
			}
			a, b, cr := mk(keys[0], 5), mk(keys[1], 1), mk(keys[2], 5)
			if ds, err := eng.take(ctx, []Request{b}); err != nil || !ds[0].Allowed {
				t.Fatalf("exhaust b: %v %v", ds, err)
			}
			ds, err := eng.take(ctx, []Request{a, b, cr})
			if err != nil {
				t.Fatal(err)
			}
			if ds[1].Allowed || !ds[0].Allowed || !ds[2].Allowed || ds[0].Remaining != 5 || ds[2].Remaining != 5 {
				t.Errorf("Take with b exhausted: %+v, want only b rejected and a, c untouched", ds)
			}
			ds, err = eng.take(ctx, []Request{a, cr, {Key: keys[0], Algorithm: rules.FixedWindow, Limit: 10, Period: noBoundary, Hits: 2}})
			if err != nil {
				t.Fatal(err)
			}
			if !ds[0].Allowed || ds[0].Remaining != 4 || ds[1].Remaining != 4 || ds[2].Remaining != 8 {
				t.Errorf("Take across slots: %+v, want all allowed and counted", ds)
			}
		})

		t.Run(eng.name+"/exact on one key", func(t *testing.T) {
			for _, alg := range []rules.Algorithm{rules.TokenBucket, rules.FixedWindow} {
				req := Request{Key: key(eng.name + "hot" + string(alg)), Algorithm: alg, Limit: 50, Period: noBoundary, Hits: 1}
				var allowed atomic.Int64
				var wg sync.WaitGroup
				for range 32 {
					wg.Go(func() {
						for range 4 {
							ds, err := eng.take(ctx, []Request{req})
							if err != nil {
								t.Error(err)
								return
							}
							if ds[0].Allowed {
								allowed.Add(1)
							}
						}
					})
				}
				wg.Wait()
				if got := allowed.Load(); got != 50 {
					t.Errorf("%s: allowed %d of 128, want exactly 50", alg, got)
				}
			}
		})

		t.Run(eng.name+"/every admission counted, no rejection counted", func(t *testing.T) {
			// A shared global limit and per-user limits on other slots: many
			// concurrent two-phase Takes. Whatever the interleaving, each
			// fixed window's count must equal the admissions it took part in
			// (a rejected request consumes nothing anywhere), the global
			// limit is never under-used, and over-admission stays within the
			// requests in flight.
			keys := spread(9, eng.name+"count")
			global := Request{Key: keys[0], Algorithm: rules.FixedWindow, Limit: 20, Period: noBoundary, Hits: 1}
			users := keys[1:]
			perUser := make([]atomic.Int64, len(users))
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for g := range 48 {
				wg.Go(func() {
					u := g % len(users)
					user := Request{Key: users[u], Algorithm: rules.FixedWindow, Limit: 4, Period: noBoundary, Hits: 1}
					for range 3 {
						ds, err := eng.take(ctx, []Request{user, global})
						if err != nil {
							t.Error(err)
							return
						}
						if ds[0].Allowed && ds[1].Allowed {
							admitted.Add(1)
							perUser[u].Add(1)
						}
					}
				})
			}
			wg.Wait()
			count := func(k string) int64 {
				v, err := c.Get(ctx, k+algorithms[rules.FixedWindow].suffix).Result()
				if err != nil {
					t.Fatalf("GET %s: %v", k, err)
				}
				_, n, _ := strings.Cut(v, ":")
				i, _ := strconv.ParseInt(n, 10, 64)
				return i
			}
			if got, want := count(global.Key), admitted.Load(); got != want {
				t.Errorf("global count %d, admitted %d", got, want)
			}
			for u, k := range users {
				if got, want := count(k), perUser[u].Load(); got != want {
					t.Errorf("user %d count %d, admitted %d", u, got, want)
				}
			}
			// 8 users × 4 = 32 want in; the global 20 binds.
			got := admitted.Load()
			if got < 20 || got > 20+48 {
				t.Errorf("admitted %d, want at least the global limit 20 and at most 20 + 48 in flight", got)
			}
			t.Logf("admitted %d with a global limit of 20 (over-admission %d)", got, got-20)
		})
	}
}
