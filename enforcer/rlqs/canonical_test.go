package rlqs

import (
	"maps"
	"strings"
	"testing"
)

// FuzzCanonical: distinct bucket ids never share an identity (so never a
// bucket, nor a presence member), and equal ones always do. Ids as
// "k=v&k=v" (later pairs of a key win).
func FuzzCanonical(f *testing.F) {
	for _, seed := range [][2]string{{"a=b", "a=b"}, {"a=b&c=d", "c=d&a=b"}, {"1:a=b", "1=:ab"}, {"ab=c", "a=bc"}, {"", "="}} {
		f.Add(seed[0], seed[1])
	}
	parse := func(s string) map[string]string {
		m := map[string]string{}
		if s == "" {
			return m
		}
		for _, kv := range strings.Split(s, "&") {
			k, v, _ := strings.Cut(kv, "=")
			m[k] = v
		}
		return m
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ma, mb := parse(a), parse(b)
		ca, ea := canonical(ma)
		cb, _ := canonical(mb)
		if (ca == cb) != maps.Equal(ma, mb) {
			t.Fatalf("canonical(%v) = %q, canonical(%v) = %q", ma, ca, mb, cb)
		}
		if len(ea) != len(ma) {
			t.Fatalf("canonical(%v) gave %d entries", ma, len(ea))
		}
		for i := 1; i < len(ea); i++ {
			if ea[i-1].Key >= ea[i].Key {
				t.Fatalf("entries %v not in key order", ea)
			}
		}
	})
}
