// Package rules is Sluice's rule language: the types of a domain's
// configuration, its YAML parser (a superset of envoyproxy/ratelimit's
// format), validation with file:line:column positions, and the compiled
// matcher that maps request descriptors to limits. It does no I/O.
package rules

import "time"

// Unit is the period a rate limit's requests_per_unit is counted over.
type Unit string

// Units of a rate limit.
const (
	Second Unit = "second"
	Minute Unit = "minute"
	Hour   Unit = "hour"
	Day    Unit = "day"
	Week   Unit = "week"
	Month  Unit = "month"
	Year   Unit = "year"
)

// Period returns the nominal length of u. Calendar units (day, month, year)
// are aligned to UTC calendar boundaries by the algorithms that support it;
// for rate computations a month counts 30 days and a year 365.
func (u Unit) Period() time.Duration {
	switch u {
	case Second:
		return time.Second
	case Minute:
		return time.Minute
	case Hour:
		return time.Hour
	case Day:
		return 24 * time.Hour
	case Week:
		return 7 * 24 * time.Hour
	case Month:
		return 30 * 24 * time.Hour
	case Year:
		return 365 * 24 * time.Hour
	}
	return 0
}

// Algorithm names the counting algorithm a limit uses.
type Algorithm string

// Algorithms.
const (
	TokenBucket          Algorithm = "token_bucket"
	LeakyBucket          Algorithm = "leaky_bucket"
	FixedWindow          Algorithm = "fixed_window"
	SlidingWindowLog     Algorithm = "sliding_window_log"
	SlidingWindowCounter Algorithm = "sliding_window_counter"
)

// FailureMode says how a limit answers when its counter store is unreachable.
type FailureMode string

// Failure modes.
const (
	FailOpen   FailureMode = "open"
	FailClosed FailureMode = "closed"
	FailLocal  FailureMode = "local"
)

// Domain is one domain's configuration: the unit of publishing.
type Domain struct {
	Name        string
	Descriptors []Descriptor
}

// Descriptor is one node of a domain's descriptor tree.
type Descriptor struct {
	Key   string
	Value string // "" matches any value (one counter per value); "p*" is a prefix

	RateLimit      *RateLimit // nil: no limit at this node
	Algorithm      Algorithm  // "" means TokenBucket
	Burst          uint32     // 0 means RequestsPerUnit
	ShadowMode     bool
	DetailedMetric bool
	FailureMode    FailureMode // "" means FailOpen

	Descriptors []Descriptor
}

// RateLimit is a descriptor's limit, with Lyft's field semantics.
type RateLimit struct {
	Unit            Unit
	RequestsPerUnit uint32
	Unlimited       bool
	Name            string
	Replaces        []string
}

// Entry is one key/value pair of a request descriptor.
type Entry struct {
	Key   string
	Value string
}
