// Package headers writes the rate-limit response headers a client sees for
// an engine decision: the IETF RateLimit-Policy and RateLimit fields
// (draft-ietf-httpapi-ratelimit-headers), Retry-After when over limit, and
// the legacy X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset.
// The HTTP check server uses it today; the gateway and the Go middleware
// will share it.
package headers

import (
	"math"
	"net/http"
	"strconv"
	"strings"
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

// Set writes the headers for res into h, describing its most restrictive
// descriptor (engine.Result.MostRestrictive):
//
//	RateLimit-Policy: "name";q=<requests per unit>;w=<window seconds>
//	RateLimit: "name";r=<remaining>;t=<seconds until reset>
//	X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset (seconds)
//
// and, when res is over limit, Retry-After in whole seconds (rounded up, at
// least 1). Nothing but Retry-After is written when no counted limit applies
// (e.g. a fail-closed rejection while the store is down).
func Set(h http.Header, res engine.Result) {
	i := res.MostRestrictive()
	if i >= 0 {
		s := res.Statuses[i]
		name := sfString(s.Limit.Name)
		window := s.Limit.Period
		if window <= 0 {
			window = s.Limit.Unit.Period()
		}
		limit := strconv.FormatUint(uint64(s.Limit.RequestsPerUnit), 10)
		remaining := strconv.FormatInt(s.Remaining, 10)
		reset := strconv.FormatInt(ceilSeconds(s.ResetAfter), 10)

		h.Set(Policy, name+";q="+limit+";w="+strconv.FormatInt(ceilSeconds(window), 10))
		h.Set(RateLimit, name+";r="+remaining+";t="+reset)
		h.Set(LegacyLimit, limit)
		h.Set(LegacyRemaining, remaining)
		h.Set(LegacyReset, reset)
	}
	if res.Code == engine.OverLimit {
		wait := int64(1)
		if i >= 0 {
			wait = max(ceilSeconds(res.Statuses[i].RetryAfter), 1)
		}
		h.Set(RetryAfter, strconv.FormatInt(wait, 10))
	}
}

// ceilSeconds rounds d up to whole seconds, never below 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(math.Ceil(d.Seconds()))
}

// sfString renders name as a structured-field string (RFC 8941): quoted,
// with '"' and '\' escaped. Characters outside printable ASCII are not
// allowed there and become '_'.
func sfString(name string) string {
	var b strings.Builder
	b.Grow(len(name) + 2)
	b.WriteByte('"')
	for _, r := range name {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r > 0x7e:
			b.WriteByte('_')
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}
