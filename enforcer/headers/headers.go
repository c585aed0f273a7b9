// Package headers renders what a client is told about an engine decision:
// the rate-limit response headers — the IETF RateLimit-Policy and RateLimit
// fields (draft-ietf-httpapi-ratelimit-headers-11, as RFC 8941 structured
// fields), Retry-After when over limit, and the legacy X-RateLimit-Limit,
// X-RateLimit-Remaining and X-RateLimit-Reset — and the RFC 9457
// problem+json body of a rejection. The HTTP check server, the gRPC service
// (as Envoy response_headers_to_add), the gateway and the Go middleware all
// use it, so every transport tells the same truth.
package headers

import (
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/enforcer/engine"
)

// Header names.
const (
	Policy          = "RateLimit-Policy"
	RateLimit       = "RateLimit"
	RetryAfter      = "Retry-After"
	LegacyLimit     = "X-RateLimit-Limit"
	LegacyRemaining = "X-RateLimit-Remaining"
	LegacyReset     = "X-RateLimit-Reset"
)

// Names lists every header Append may produce.
var Names = []string{Policy, RateLimit, RetryAfter, LegacyLimit, LegacyRemaining, LegacyReset}

// Field is one response header.
type Field struct {
	Name, Value string
}

// Append appends the headers for res to dst and returns the extended slice:
//
//	RateLimit-Policy: "name";q=<requests per unit>;w=<window seconds>, ...
//	RateLimit: "name";r=<remaining>;t=<seconds until the bucket is full>, ...
//	X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset (seconds)
//	Retry-After: <seconds>   (only when res is over limit)
//
// The two IETF fields are structured-field lists with one item per enforced
// limit that counted the request (named by its rule name; the first limit
// of a name wins), the most restrictive limit first
// (engine.Result.MostRestrictive); the legacy fields describe that most
// restrictive limit alone. Shadow-mode limits are never reported. Retry-After
// is in whole seconds, rounded up, at least 1. Nothing but Retry-After is
// produced when no counted limit applies (e.g. a fail-closed rejection while
// the store is down).
func Append(dst []Field, res engine.Result) []Field {
	best := res.MostRestrictive()
	if best >= 0 {
		// Every value is built in one buffer and cut from one string: two
		// allocations for all five fields.
		buf := make([]byte, 0, 160)
		top := res.Statuses[best]
		buf = policyItem(buf, top)
		for i, s := range res.Statuses {
			if i != best && reported(s) && s.Limit.Name != top.Limit.Name && !seen(res.Statuses[:i], s.Limit.Name) {
				buf = policyItem(append(buf, ", "...), s)
			}
		}
		var ends [5]int
		ends[0] = len(buf)
		buf = stateItem(buf, top)
		for i, s := range res.Statuses {
			if i != best && reported(s) && s.Limit.Name != top.Limit.Name && !seen(res.Statuses[:i], s.Limit.Name) {
				buf = stateItem(append(buf, ", "...), s)
			}
		}
		ends[1] = len(buf)
		buf = strconv.AppendUint(buf, uint64(top.Limit.RequestsPerUnit), 10)
		ends[2] = len(buf)
		buf = strconv.AppendInt(buf, max(top.Remaining, 0), 10)
		ends[3] = len(buf)
		buf = strconv.AppendInt(buf, ceilSeconds(top.ResetAfter), 10)
		ends[4] = len(buf)
		all := string(buf)
		dst = append(dst,
			Field{Policy, all[:ends[0]]},
			Field{RateLimit, all[ends[0]:ends[1]]},
			Field{LegacyLimit, all[ends[1]:ends[2]]},
			Field{LegacyRemaining, all[ends[2]:ends[3]]},
			Field{LegacyReset, all[ends[3]:ends[4]]},
		)
	}
	if res.Code == engine.OverLimit {
		dst = append(dst, Field{RetryAfter, strconv.FormatInt(RetryAfterSeconds(res), 10)})
	}
	return dst
}

// Set writes the headers for res into h (see Append), replacing any values
// h had under those names.
func Set(h http.Header, res engine.Result) {
	var buf [6]Field
	for _, f := range Append(buf[:0], res) {
		h.Set(f.Name, f.Value)
	}
}

// RetryAfterSeconds returns the wait a rejected client is told: the most
// restrictive rejecting limit's retry-after in whole seconds, rounded up, at
// least 1 (also when no counted limit tells, e.g. failing closed).
func RetryAfterSeconds(res engine.Result) int64 {
	if i := res.MostRestrictive(); i >= 0 {
		return max(ceilSeconds(res.Statuses[i].RetryAfter), 1)
	}
	return 1
}

// reported reports whether s belongs in the IETF fields.
func reported(s engine.Status) bool { return s.Limited() && !s.Limit.ShadowMode }

func seen(before []engine.Status, name string) bool {
	for _, s := range before {
		if reported(s) && s.Limit.Name == name {
			return true
		}
	}
	return false
}

// policyItem appends s's member of RateLimit-Policy.
func policyItem(b []byte, s engine.Status) []byte {
	window := s.Limit.Period
	if window <= 0 {
		window = s.Limit.Unit.Period()
	}
	b = appendString(b, s.Limit.Name)
	b = append(b, ";q="...)
	b = strconv.AppendUint(b, uint64(s.Limit.RequestsPerUnit), 10)
	b = append(b, ";w="...)
	return strconv.AppendInt(b, ceilSeconds(window), 10)
}

// stateItem appends s's member of RateLimit.
func stateItem(b []byte, s engine.Status) []byte {
	b = appendString(b, s.Limit.Name)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, max(s.Remaining, 0), 10)
	b = append(b, ";t="...)
	return strconv.AppendInt(b, ceilSeconds(s.ResetAfter), 10)
}

// ceilSeconds rounds d up to whole seconds, never below 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(math.Ceil(d.Seconds()))
}

// appendString appends name as a structured-field string (RFC 8941
// §3.3.3): quoted, with '"' and '\' escaped. Characters outside printable
// ASCII are not allowed there and become '_'.
func appendString(b []byte, name string) []byte {
	b = append(b, '"')
	for _, r := range name {
		switch {
		case r == '"' || r == '\\':
			b = append(b, '\\', byte(r))
		case r < 0x20 || r > 0x7e:
			b = append(b, '_')
		default:
			b = append(b, byte(r))
		}
	}
	return append(b, '"')
}
