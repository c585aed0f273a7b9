// Package rules is Sluice's rule language: the types of a domain's
// configuration, its YAML parser (a superset of envoyproxy/ratelimit's
// format), validation with file:line:column positions, the compiled matcher
// that maps request descriptors to limits, the canonical formatter, the JSON
// Schema of the format and ruleset diffs. It does no I/O.
package rules

import "time"

// Unit is the period a rate limit's requests_per_unit is counted over.
//
// Every algorithm counts a unit as its nominal length (Period): a rolling
// window or a refill rate. With Descriptor.Calendar, fixed_window instead
// counts day, week, month and year in UTC calendar windows: a day starts at
// 00:00 UTC, a week on Monday 00:00 UTC, a month on its 1st and a year on
// 1 January, so a monthly quota resets when the month does, whatever its
// length.
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

// Period returns the nominal length of u: a month counts 30 days and a year
// 365. Calendar windows (see Unit) use the real calendar instead. It returns
// 0 for an unknown unit.
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
	FailOpen   FailureMode = "open"   // allow the request
	FailClosed FailureMode = "closed" // reject the request
	FailLocal  FailureMode = "local"  // count in the node's memory until the store is back
)

// Consistency says how closely an enforcer counts a limit with the fleet.
type Consistency string

// Consistencies.
const (
	// Exact asks the counter store for every check (the default).
	Exact Consistency = "exact"
	// Async decides from the node's local view, sends its counts to the
	// store in batches and asks the store again near the limit
	// (enforcer/engine's async counting).
	Async Consistency = "async"
)

// Scope says where a limit holds when enforcers run in several regions.
type Scope string

// Scopes.
const (
	// ScopeRegion limits hold in each region on its own: each region's
	// enforcers count in their own Redis.
	ScopeRegion Scope = "region"
	// ScopeGlobal limits hold across every region: each region counts in
	// its own Redis and learns the others' counts through the global store
	// (enforcer/engine's regions). fixed_window and sliding_window_counter
	// only.
	ScopeGlobal Scope = "global"
)

// Action is what a limit does with a request over it.
type Action string

// Actions.
const (
	// Reject answers over-limit requests at once (HTTP 429 by default).
	Reject Action = "reject"
	// Delay holds an over-limit request until the bucket lets it through,
	// for at most OnLimit.MaxDelay, and rejects it when that is not enough.
	// Only token_bucket and leaky_bucket can say how long to wait.
	Delay Action = "delay"
)

// Bounds of on_limit and shards.
const (
	// MaxDelay bounds on_limit.max_delay: a request held longer than this
	// ties up a connection for little gain.
	MaxDelay = time.Minute
	// DefaultStatus is the HTTP status of a rejected request.
	DefaultStatus = 429
	// MaxShards bounds shards.
	MaxShards = 64
	// MaxPeriod bounds a limit's period (its unit times unit_multiplier):
	// one year, the longest unit.
	MaxPeriod = 365 * 24 * time.Hour
	// MaxUnitMultiplier bounds unit_multiplier: a year of seconds.
	MaxUnitMultiplier = 365 * 24 * 60 * 60
)

// Domain is one domain's configuration: the unit of publishing.
type Domain struct {
	Name string
	// DefaultAlgorithm is Sluice's default_algorithm: the algorithm of every
	// limit in the domain that names none. "" means TokenBucket. File mode
	// and the Lyft import count Lyft files, which have none, as FixedWindow,
	// as Lyft does.
	DefaultAlgorithm Algorithm
	// RequestDescriptors tell the enforcer's gateway mode how to build a
	// request's descriptors from an HTTP request. Envoy and the check APIs
	// send descriptors themselves and ignore it.
	RequestDescriptors []RequestDescriptor
	Descriptors        []Descriptor
	// Overrides give the requests with exactly these entries another rate
	// (see Override). The console writes them; file mode reads them too.
	Overrides []Override
}

// Descriptor is one node of a domain's descriptor tree.
type Descriptor struct {
	Key string
	// Value "" matches any value (one counter per value); a value with "*"
	// is a wildcard, each "*" standing for any run of characters, none
	// included ("p*" is a prefix, "/api*v1" a prefix and a suffix).
	Value string

	RateLimit      *RateLimit // nil: no limit at this node
	ShadowMode     bool
	DetailedMetric bool
	// ValueToMetric is Lyft's value_to_metric: put the request's value in
	// this level's metric name. It changes reporting only.
	ValueToMetric bool
	// ShareThreshold is Lyft's share_threshold, for a wildcard Value only:
	// every value matching the wildcard counts against one shared counter
	// instead of one counter per value.
	ShareThreshold bool
	// Metadata is Lyft's metadata: a mapping of anything, kept with the
	// descriptor and its file, never read by the enforcer.
	Metadata map[string]any

	// Sluice's extensions; they need a RateLimit that is not unlimited.
	Algorithm   Algorithm   // "" means the domain's DefaultAlgorithm
	Burst       uint32      // 0 means RequestsPerUnit; token and leaky buckets only
	Calendar    bool        // fixed_window only: UTC calendar windows (see Unit)
	Shards      uint32      // 0 means 1: spread a hot counter over this many keys
	FailureMode FailureMode // "" means FailOpen
	OnLimit     *OnLimit    // nil means reject with DefaultStatus
	// Lease lets an enforcer take part of the limit's remaining quota and
	// decide locally (enforcer/engine's leases); not for sliding_window_log.
	Lease bool
	// Consistency: "" means Exact.
	Consistency Consistency

	Scope Scope // "" means ScopeRegion

	Descriptors []Descriptor
}

// RateLimit is a descriptor's limit, with Lyft's field semantics.
type RateLimit struct {
	Unit Unit
	// RequestsPerUnit may be 0: as in Lyft, such a limit rejects every
	// request (a block list entry).
	RequestsPerUnit uint32
	// UnitMultiplier is Lyft's unit_multiplier: the limit's period is this
	// many units (5 minutes, 30 seconds). 0 and 1 mean one unit; the period
	// is at most MaxPeriod.
	UnitMultiplier uint32
	Unlimited      bool
	Name           string
	Replaces       []string
}

// OnLimit says what happens to a request over its limit.
type OnLimit struct {
	Action   Action        // "" means Reject
	MaxDelay time.Duration // Delay only: the longest a request is held; required
	Status   int           // HTTP status of a rejection; 0 means DefaultStatus
}

// Entry is one key/value pair of a request descriptor.
type Entry struct {
	Key   string `json:"key"`
	Value string `json:"value,omitempty"`
}

// Source is where gateway mode takes a request descriptor entry's value.
type Source string

// Sources of request descriptor entries.
const (
	FromHeader        Source = "header"         // a request header, named by Name
	FromRemoteAddress Source = "remote_address" // the client's IP address
	FromPath          Source = "path"           // the URL path, without the query
	FromMethod        Source = "method"         // GET, POST, ...
	FromQuery         Source = "query"          // a query parameter, named by Name
)

// RequestDescriptor is how gateway mode builds one descriptor of a request:
// one entry per element of Entries, in order. When any entry's source is
// missing from the request (an absent or empty header or query parameter),
// the request simply does not carry this descriptor.
type RequestDescriptor struct {
	Entries []RequestEntry
}

// RequestEntry is one entry of a RequestDescriptor: its key and where its
// value comes from. Exactly one of From and Value is set; Value is a fixed
// value, as for a global limit ({key: scope, value: global}).
type RequestEntry struct {
	Key   string
	From  Source
	Name  string // the header or query parameter, for FromHeader and FromQuery
	Value string
}

// Resolve builds the descriptor's entries for one request, appending them to
// dst[:0]. lookup returns the value of an entry with a From source and
// whether the request has it; entries with a fixed Value do not call it. ok
// is false when some source is missing (or empty): the request then does not
// carry this descriptor.
func (rd RequestDescriptor) Resolve(lookup func(RequestEntry) (string, bool), dst []Entry) (entries []Entry, ok bool) {
	entries = dst[:0]
	for _, e := range rd.Entries {
		v := e.Value
		if e.From != "" {
			var found bool
			if v, found = lookup(e); !found || v == "" {
				return entries, false
			}
		}
		entries = append(entries, Entry{Key: e.Key, Value: v})
	}
	return entries, true
}
