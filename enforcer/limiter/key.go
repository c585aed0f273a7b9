package limiter

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/sluicehq/sluice/rules"
)

// MaxKeyPart is the longest domain, entry key or entry value (in bytes) that
// Key keeps readable; longer ones are replaced by a hash.
const MaxKeyPart = 128

// Key returns the Redis key of one descriptor's limit in domain:
//
//	prefix{domain:key1=value1:key2=value2}
//
// Distinct (domain, entries) pairs never share a key: within the domain and
// the entries, the separators ':' and '=' and the characters '%', '#', '{'
// and '}' are percent-escaped (so key "a:b" value "c" and key "a" value "b:c"
// differ), and a part longer than MaxKeyPart bytes becomes '#' followed by 32
// hex digits of its SHA-256 (an escaped part never starts with a bare '#').
// In prefix only '%', '{' and '}' are escaped, so a prefix like "sluice:"
// stays readable and cannot break the hash tag.
//
// The braces are a Redis Cluster hash tag: every key derived from one
// descriptor (Take appends algorithm suffixes after the tag) maps to one slot.
func Key(prefix, domain string, entries []rules.Entry) string {
	var b strings.Builder
	n := len(prefix) + len(domain) + 2
	for _, e := range entries {
		n += len(e.Key) + len(e.Value) + 2
	}
	b.Grow(n)
	escape(&b, prefix, "%{}")
	b.WriteByte('{')
	part(&b, domain)
	for _, e := range entries {
		b.WriteByte(':')
		part(&b, e.Key)
		b.WriteByte('=')
		part(&b, e.Value)
	}
	b.WriteByte('}')
	return b.String()
}

// partSpecial are the bytes escaped inside the hash tag.
const partSpecial = "%:=#{}"

// part writes one domain, entry key or entry value: escaped, or hashed when
// long.
func part(b *strings.Builder, s string) {
	if len(s) > MaxKeyPart {
		sum := sha256.Sum256([]byte(s))
		var hx [32]byte
		hex.Encode(hx[:], sum[:16])
		b.WriteByte('#')
		b.Write(hx[:])
		return
	}
	escape(b, s, partSpecial)
}

// escape writes s with every byte of special replaced by %XX.
func escape(b *strings.Builder, s, special string) {
	if !strings.ContainsAny(s, special) {
		b.WriteString(s)
		return
	}
	const digits = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if strings.IndexByte(special, c) < 0 {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(digits[c>>4])
		b.WriteByte(digits[c&0xF])
	}
}
