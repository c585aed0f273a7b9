package limiter

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/rules"
)

func entries(kv ...string) []rules.Entry {
	var es []rules.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, rules.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}

func TestKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		prefix  string
		domain  string
		entries []rules.Entry
		want    string
	}{
		{"plain", "sluice:", "api", entries("api_key", "k1", "route", "/search"), "sluice:{api:api_key=k1:route=/search}"},
		{"no entries", "sluice:", "api", nil, "sluice:{api}"},
		{"empty value", "sluice:", "api", entries("k", ""), "sluice:{api:k=}"},
		{"separators escaped", "p:", "d:x", entries("a:b", "c=d"), "p:{d%3Ax:a%3Ab=c%3Dd}"},
		{"braces escaped", "p{x}:", "d", entries("k", "{v}"), "p%7Bx%7D:{d:k=%7Bv%7D}"},
		{"percent and hash escaped", "p:", "d", entries("k", "#%"), "p:{d:k=%23%25}"},
		{"unicode kept", "p:", "d", entries("city", "Zürich"), "p:{d:city=Zürich}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Key(tt.prefix, tt.domain, tt.entries); got != tt.want {
				t.Errorf("Key = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestKeyNoCollisions(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("v", MaxKeyPart+1)
	hashed := Key("p:", "d", entries("k", long))
	groups := [][]rules.Entry{
		entries("a:b", "c"),
		entries("a", "b:c"),
		entries("a", "b", "c", "d"),
		entries("a", "b:c=d"),
		entries("a=b", "c"),
		entries("a", "b=c"),
		entries("a", ""),
		entries("a", "", "", ""),
		entries("", "a"),
		entries("k", long),
		entries("k", long+"w"),
		entries("k", strings.TrimPrefix(hashed, "p:{d:k=")[:33]), // looks like a hash
		entries("k", "%3A"),
		entries("k", ":"),
		nil,
	}
	seen := map[string]int{}
	for i, es := range groups {
		k := Key("p:", "d", es)
		if j, dup := seen[k]; dup {
			t.Errorf("entries %v and %v share key %q", groups[j], es, k)
		}
		seen[k] = i
	}
	if a, b := Key("p:", "a:b", nil), Key("p:", "a", entries("b", "")); a == b {
		t.Errorf("domain %q and domain+entry share key %q", "a:b", a)
	}
}

func TestKeyLongValues(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 10_000)
	k := Key("p:", long, entries(long, long))
	if len(k) > 200 {
		t.Errorf("key of long parts is %d bytes, want them hashed: %q", len(k), k)
	}
	if k2 := Key("p:", long, entries(long, long+"y")); k2 == k {
		t.Error("different long values share a key")
	}
	if k3 := Key("p:", long, entries(long, long)); k3 != k {
		t.Error("Key is not deterministic")
	}
	exact := strings.Repeat("x", MaxKeyPart)
	if k := Key("p:", "d", entries("k", exact)); !strings.Contains(k, exact) {
		t.Errorf("a %d-byte value should stay readable: %q", MaxKeyPart, k)
	}
}

// hashTag returns the part of key Redis Cluster hashes.
func hashTag(key string) string {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return key
	}
	end := strings.IndexByte(key[open+1:], '}')
	if end <= 0 {
		return key
	}
	return key[open+1 : open+1+end]
}

func TestKeyHashTag(t *testing.T) {
	t.Parallel()
	k := Key("p{}:", "d}{", entries("k}", "{v", "x", "y"))
	if strings.Count(k, "{") != 1 || strings.Count(k, "}") != 1 || !strings.HasSuffix(k, "}") {
		t.Fatalf("key %q must hold exactly one hash tag, at the end", k)
	}
	tag := hashTag(k)
	if want := "d%7D%7B:k%7D=%7Bv:x=y"; tag != want {
		t.Errorf("hash tag = %q, want %q", tag, want)
	}
	// Algorithm suffixes go after the tag, so state keys share its slot.
	for alg, info := range algorithms {
		if hashTag(k+info.suffix) != tag || Slot(k+info.suffix) != Slot(k) {
			t.Errorf("%s state suffix changes the hash tag", alg)
		}
	}
}

func FuzzKey(f *testing.F) {
	f.Add("a:b", "c", "a", "b:c")
	f.Add("k", "%3A", "k", ":")
	f.Add("{", "}", "", "")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		a, b := Key("p:", "d", entries(k1, v1)), Key("p:", "d", entries(k2, v2))
		short := len(k1) <= MaxKeyPart && len(v1) <= MaxKeyPart && len(k2) <= MaxKeyPart && len(v2) <= MaxKeyPart
		if short && (a == b) != (k1 == k2 && v1 == v2) {
			t.Errorf("Key(%q=%q) = %q, Key(%q=%q) = %q", k1, v1, a, k2, v2, b)
		}
		if strings.Count(a, "{") != 1 || strings.Count(a, "}") != 1 {
			t.Errorf("Key(%q=%q) = %q: want exactly one hash tag", k1, v1, a)
		}
	})
}

func TestKeyWorksInRedis(t *testing.T) {
	t.Parallel()
	r, _, prefix := newTestRedis(t)
	// Colliding-looking descriptors keep separate counters.
	a := Request{Key: Key(prefix, "d", entries("a:b", "c")), Limit: 1, Period: time.Hour, Burst: 1, Hits: 1}
	b := Request{Key: Key(prefix, "d", entries("a", "b:c")), Limit: 1, Period: time.Hour, Burst: 1, Hits: 1}
	for _, req := range []Request{a, b} {
		if d := take1(t, r, req); !d.Allowed {
			t.Errorf("%s: not allowed; its counter is shared with the other key", req.Key)
		}
	}
	keys := []string{stateKey(a), stateKey(b)}
	slices.Sort(keys)
	got, err := r.client.Keys(context.Background(), prefix+"*").Result()
	if err != nil {
		t.Fatalf("KEYS: %v", err)
	}
	slices.Sort(got)
	if !slices.Equal(got, keys) {
		t.Errorf("keys under prefix = %q, want %q", got, keys)
	}
}
