package rules

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Bounds on a domain's configuration. They keep hostile or runaway input from
// exhausting memory or CPU in the console and on every enforcer.
const (
	// MaxSourceBytes bounds the size of one domain's YAML.
	MaxSourceBytes = 1 << 20
	// MaxDepth bounds how deeply descriptors nest, and so the entries of a
	// request descriptor that can match.
	MaxDepth = 16
	// MaxDescriptors bounds the number of descriptors in one domain.
	MaxDescriptors = 100_000
	// MaxRequestsPerUnit bounds requests_per_unit and burst.
	MaxRequestsPerUnit = 1_000_000_000
	// MaxSlidingLogRequests bounds a sliding_window_log limit's
	// requests_per_unit per key (per shard, with shards): its log keeps one
	// Redis sorted-set member per request in the window, about 120 bytes
	// beyond 128 members (BENCHMARKS.md), so about 1.2 MB at the bound.
	MaxSlidingLogRequests = 10_000
	// MaxRequestDescriptors bounds a domain's request_descriptors.
	MaxRequestDescriptors = 64
)

const maxDomainName = 128

// units lists the valid units, in the order error messages show them.
var units = []Unit{Second, Minute, Hour, Day, Week, Month, Year}

// calendarUnits are the units calendar windows exist for.
var calendarUnits = []Unit{Day, Week, Month, Year}

// algorithms lists every algorithm name the rule language knows.
var algorithms = []Algorithm{TokenBucket, LeakyBucket, FixedWindow, SlidingWindowLog, SlidingWindowCounter}

// supportedAlgorithms are the algorithms the enforcer implements. A known
// algorithm missing here is rejected as "not supported yet".
var supportedAlgorithms = []Algorithm{TokenBucket, LeakyBucket, FixedWindow, SlidingWindowLog, SlidingWindowCounter}

// bucketAlgorithms are the algorithms that have a capacity, so burst means
// something to them, and that can tell how long a request must wait, so
// on_limit can delay.
var bucketAlgorithms = []Algorithm{TokenBucket, LeakyBucket}

var failureModes = []FailureMode{FailOpen, FailClosed, FailLocal}

var consistencies = []Consistency{Exact, Async}

var scopes = []Scope{ScopeRegion, ScopeGlobal}

var actions = []Action{Reject, Delay}

var sources = []Source{FromHeader, FromRemoteAddress, FromPath, FromMethod, FromQuery}

// checker collects the semantic problems of a Domain. It works on the typed
// tree, so Compile applies the same rules to domains that never were YAML.
type checker struct {
	problems []Problem
	count    int               // descriptors seen
	names    map[string]string // limit name → path of the rate_limit that has it
	replaces []replaceRef      // checked once every name is known
	// def is the algorithm of a limit that names none: the domain's
	// default_algorithm, else TokenBucket; "" when default_algorithm is
	// unknown (checking against it would say nothing).
	def Algorithm
	// defSet says the domain has a default_algorithm, for messages.
	defSet bool
}

type replaceRef struct{ name, path string }

// validate returns d's problems, with paths but no positions.
func validate(d *Domain) []Problem {
	c := &checker{names: map[string]string{}, def: cmp.Or(d.DefaultAlgorithm, TokenBucket), defSet: d.DefaultAlgorithm != ""}
	if msg := domainNameProblem(d.Name); msg != "" {
		c.fail("domain", msg)
	}
	if d.DefaultAlgorithm != "" {
		if msg := algorithmProblem(d.DefaultAlgorithm); msg != "" {
			c.fail("default_algorithm", msg)
			c.def = ""
		}
	}
	c.descriptors(d.Descriptors, "", "", 1)
	for _, r := range c.replaces {
		if _, ok := c.names[r.name]; !ok {
			c.fail(r.path, "replaces unknown rate limit "+quote(r.name))
		}
	}
	c.requestDescriptors(d)
	c.overrides(d)
	return c.problems
}

func (c *checker) fail(path, msg string) {
	c.problems = append(c.problems, Problem{Path: path, Message: msg})
}

// DomainNameProblem says what is wrong with a domain's name, or "" when
// nothing is.
func DomainNameProblem(name string) string { return domainNameProblem(name) }

func domainNameProblem(name string) string {
	switch {
	case name == "":
		return "domain is required"
	case len(name) > maxDomainName:
		return fmt.Sprintf("domain is longer than %d characters", maxDomainName)
	}
	for _, r := range name {
		if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '_' || r == '.' || r == '-') {
			return fmt.Sprintf("domain %s may contain only letters, digits, \"_\", \".\" and \"-\"", quote(name))
		}
	}
	return ""
}

// descriptors checks one level of the tree. parent is the path of the
// descriptor holding it ("" for the top level), prefix its Lyft-style name.
func (c *checker) descriptors(ds []Descriptor, parent, prefix string, depth int) {
	if len(ds) == 0 {
		return
	}
	list := join(parent, "descriptors")
	if depth > MaxDepth {
		c.fail(list, depthMessage)
		return
	}
	type keyValue struct{ key, value string }
	seen := make(map[keyValue]int, len(ds))
	for i := range ds {
		d := &ds[i]
		path := index(list, i)
		c.count++
		if c.count > MaxDescriptors {
			if c.count == MaxDescriptors+1 {
				c.fail(path, countMessage)
			}
			return
		}
		first, dup := seen[keyValue{d.Key, d.Value}]
		switch {
		case d.Key == "":
			c.fail(join(path, "key"), "key is required")
		case dup:
			c.fail(path, duplicateMessage(d.Key, d.Value, index(list, first)))
		default:
			seen[keyValue{d.Key, d.Value}] = i
		}
		c.text(d.Key, join(path, "key"), "key")
		c.text(d.Value, join(path, "value"), "value")
		name := pathName(prefix, d)
		if d.RateLimit != nil {
			// A duplicate's default name is its twin's: say so only once.
			c.rateLimit(d.RateLimit, join(path, "rate_limit"), name, !dup)
		}
		if d.ShareThreshold && !isWildcard(d.Value) {
			c.fail(join(path, "share_threshold"), `share_threshold applies only to a wildcard value (one with a "*")`)
		}
		c.extensions(d, path)
		c.descriptors(d.Descriptors, path, name, depth+1)
	}
}

// text checks a key or value Go code may have filled with anything.
func (c *checker) text(s, path, field string) {
	if !utf8.ValidString(s) {
		c.fail(path, field+" must be valid UTF-8 text")
	}
}

var (
	depthMessage = fmt.Sprintf("descriptors nest more than %d levels deep", MaxDepth)
	countMessage = fmt.Sprintf("a domain may have at most %d descriptors", MaxDescriptors)
)

func duplicateMessage(key, value, first string) string {
	if value == "" {
		return fmt.Sprintf("duplicate descriptor: key %s without a value is already at %s", quote(key), first)
	}
	return fmt.Sprintf("duplicate descriptor: key %s value %s is already at %s", quote(key), quote(value), first)
}

// rateLimit checks a descriptor's limit; register says whether to claim its
// name.
func (c *checker) rateLimit(rl *RateLimit, path, defaultName string, register bool) {
	if rl.Unlimited {
		if rl.Unit != "" {
			c.fail(join(path, "unit"), "an unlimited rate limit takes no unit")
		}
		if rl.RequestsPerUnit != 0 {
			c.fail(join(path, "requests_per_unit"), "an unlimited rate limit takes no requests_per_unit")
		}
		if rl.UnitMultiplier != 0 {
			c.fail(join(path, "unit_multiplier"), "an unlimited rate limit takes no unit_multiplier")
		}
	} else {
		if rl.Unit == "" {
			c.fail(join(path, "unit"), "unit is required "+unitList)
		} else if rl.Unit.Period() == 0 {
			c.fail(join(path, "unit"), unitMessage(string(rl.Unit)))
		}
		if msg := rangeProblem("requests_per_unit", int64(rl.RequestsPerUnit), 0, MaxRequestsPerUnit); msg != "" {
			c.fail(join(path, "requests_per_unit"), msg)
		}
		if m := rl.UnitMultiplier; m > 1 {
			// Compare before multiplying, so nothing can overflow.
			if p := rl.Unit.Period(); p > 0 && (m > MaxUnitMultiplier || time.Duration(m) > MaxPeriod/p) {
				c.fail(join(path, "unit_multiplier"), fmt.Sprintf("%d × %s is longer than a year, the longest period", m, rl.Unit))
			}
		}
	}

	name, namePath := rl.Name, join(path, "name")
	if name == "" {
		name, namePath = defaultName, path
	}
	if other, dup := c.names[name]; dup && register {
		c.fail(namePath, fmt.Sprintf("rate limit name %s is already used by %s", quote(name), other))
	} else if register {
		c.names[name] = path
	}

	for i, r := range rl.Replaces {
		p := join(index(join(path, "replaces"), i), "name")
		switch r {
		case "":
			c.fail(p, "name is required")
		case name:
			c.fail(p, "a rate limit cannot replace itself")
		default:
			c.replaces = append(c.replaces, replaceRef{r, p})
		}
	}
}

// extensions checks Sluice's fields of a descriptor, alone and together.
func (c *checker) extensions(d *Descriptor, path string) {
	set := extensionsSet(d)
	if len(set) > 0 {
		// They configure how a limit is counted and enforced: without a
		// counted limit they would silently do nothing.
		why := ""
		switch {
		case d.RateLimit == nil:
			why = "applies only to a descriptor with a rate_limit"
		case d.RateLimit.Unlimited:
			why = "has no effect on an unlimited rate limit"
		}
		if why != "" {
			for _, f := range set {
				c.fail(join(path, f), f+" "+why)
			}
			return
		}
	}
	algo := cmp.Or(d.Algorithm, c.def)
	if d.Algorithm != "" {
		if msg := algorithmProblem(d.Algorithm); msg != "" {
			c.fail(join(path, "algorithm"), msg)
			algo = "" // unknown: checking the rest against it says nothing
		}
	}
	if d.FailureMode != "" && !slices.Contains(failureModes, d.FailureMode) {
		c.fail(join(path, "failure_mode"), fmt.Sprintf("%s is not a failure mode %s", quote(string(d.FailureMode)), list(failureModes)))
	}
	var rpu uint32
	if d.RateLimit != nil {
		rpu = d.RateLimit.RequestsPerUnit
	}
	if d.Burst != 0 {
		switch msg := rangeProblem("burst", int64(d.Burst), 1, MaxRequestsPerUnit); {
		case msg != "":
			c.fail(join(path, "burst"), msg)
		case algo != "" && !slices.Contains(bucketAlgorithms, algo):
			c.fail(join(path, "burst"), fmt.Sprintf("burst applies only to %s, not to %s%s", andList(bucketAlgorithms), algo, c.defaultNote(d)))
		case rpu == 0:
			c.fail(join(path, "burst"), "burst has no effect on a limit of 0 requests_per_unit, which rejects every request")
		}
	}
	if d.Calendar {
		unit := d.RateLimit.Unit
		switch {
		case algo != "" && algo != FixedWindow:
			msg := fmt.Sprintf("calendar windows apply only to algorithm fixed_window, not to %s%s", algo, c.defaultNote(d))
			if d.Algorithm == "" {
				msg += ": set algorithm: fixed_window"
			}
			c.fail(join(path, "calendar"), msg)
		case unit.Period() != 0 && !slices.Contains(calendarUnits, unit):
			c.fail(join(path, "calendar"), fmt.Sprintf("calendar windows need a unit of %s, not %s", orList(calendarUnits), unit))
		case d.RateLimit.UnitMultiplier > 1:
			c.fail(join(path, "calendar"), "calendar windows are one unit long: they take no unit_multiplier")
		}
	}
	if d.Shards != 0 {
		switch msg := rangeProblem("shards", int64(d.Shards), 1, MaxShards); {
		case msg != "":
			c.fail(join(path, "shards"), msg)
		case d.Shards > 1 && d.Shards > rpu:
			c.fail(join(path, "shards"), fmt.Sprintf("shards (%d) is more than requests_per_unit (%d): a shard would allow less than one request", d.Shards, rpu))
		}
	}
	if algo == SlidingWindowLog && d.RateLimit != nil && !d.RateLimit.Unlimited {
		shards := max(d.Shards, 1)
		if perKey := (uint64(rpu) + uint64(shards) - 1) / uint64(shards); perKey > MaxSlidingLogRequests {
			where := fmt.Sprintf("here %d", perKey)
			if shards > 1 {
				where = fmt.Sprintf("here %d per shard", perKey)
			}
			c.fail(join(join(path, "rate_limit"), "requests_per_unit"), fmt.Sprintf(
				"sliding_window_log keeps one Redis entry per request in its window: at most %d requests_per_unit per key (%s); use sliding_window_counter, or shards",
				MaxSlidingLogRequests, where))
		}
	}
	if d.OnLimit != nil {
		c.onLimit(d, algo, rpu, join(path, "on_limit"))
	}
	if d.Scope != "" {
		c.scope(d, algo, join(path, "scope"))
	}
	if d.Lease {
		switch {
		case algo == SlidingWindowLog:
			c.fail(join(path, "lease"), "sliding_window_log cannot be leased (it logs every request where it is counted); use sliding_window_counter")
		case algo == LeakyBucket && d.OnLimit != nil && d.OnLimit.Action == Delay:
			c.fail(join(path, "lease"), "a leaky_bucket that delays cannot be leased (every request needs its own place in the queue)")
		case rpu == 0:
			c.fail(join(path, "lease"), "a limit of 0 requests_per_unit rejects every request; there is nothing to lease")
		}
	}
	c.consistency(d, rpu, join(path, "consistency"))
}

// consistency checks consistency: async against the limit's other fields.
func (c *checker) consistency(d *Descriptor, rpu uint32, path string) {
	switch {
	case d.Consistency == "" || d.Consistency == Exact:
	case d.Consistency != Async:
		c.fail(path, fmt.Sprintf("%s is not a consistency %s", quote(string(d.Consistency)), list(consistencies)))
	case d.OnLimit != nil && d.OnLimit.Action == Delay:
		c.fail(path, "consistency: async cannot delay requests (on_limit: delay gives every request its own place in a queue, which only the store knows)")
	case d.Lease:
		c.fail(path, "consistency: async and lease both take a hot limit off the store; set one of them")
	case d.Shards > 1:
		c.fail(path, "consistency: async and shards both take a hot limit off one store key; set one of them")
	case rpu == 0:
		c.fail(path, "a limit of 0 requests_per_unit rejects every request; there is nothing to count asynchronously")
	}
}

// defaultNote says where a descriptor's algorithm comes from when it names
// none, for messages about it.
func (c *checker) defaultNote(d *Descriptor) string {
	switch {
	case d.Algorithm != "":
		return ""
	case c.defSet:
		return " (the domain's default_algorithm)"
	}
	return " (the default)"
}

// extensionsSet names the Sluice extension fields d sets.
func extensionsSet(d *Descriptor) []string {
	var set []string
	add := func(ok bool, name string) {
		if ok {
			set = append(set, name)
		}
	}
	add(d.Algorithm != "", "algorithm")
	add(d.Burst != 0, "burst")
	add(d.Calendar, "calendar")
	add(d.Shards != 0, "shards")
	add(d.FailureMode != "", "failure_mode")
	add(d.OnLimit != nil, "on_limit")
	add(d.Lease, "lease")
	add(d.Consistency != "", "consistency")
	add(d.Scope != "", "scope")
	return set
}

// scope checks d's scope: a global limit is aggregated across regions per
// counting window, so it needs a window algorithm.
func (c *checker) scope(d *Descriptor, algo Algorithm, path string) {
	switch {
	case !slices.Contains(scopes, d.Scope):
		c.fail(path, fmt.Sprintf("%s is not a scope %s", quote(string(d.Scope)), list(scopes)))
	case d.Scope != ScopeGlobal, algo == "": // algo "": unknown, reported already
	case algo != FixedWindow && algo != SlidingWindowCounter:
		c.fail(path, fmt.Sprintf("scope: global needs algorithm fixed_window or sliding_window_counter, not %s%s: regions exchange their counts per window", algo, c.defaultNote(d)))
	case d.Lease:
		c.fail(path, "scope: global cannot be combined with lease: a lease's units are taken from one region's counter")
	}
}

func (c *checker) onLimit(d *Descriptor, algo Algorithm, rpu uint32, path string) {
	ol := d.OnLimit
	if ol.Action != "" && !slices.Contains(actions, ol.Action) {
		c.fail(join(path, "action"), fmt.Sprintf("%s is not an action %s", quote(string(ol.Action)), list(actions)))
	}
	if ol.Action == Delay {
		switch {
		case algo != "" && !slices.Contains(bucketAlgorithms, algo):
			c.fail(join(path, "action"), fmt.Sprintf("delay needs algorithm %s (they can tell how long to wait), not %s%s", orList(bucketAlgorithms), algo, c.defaultNote(d)))
		case d.ShadowMode:
			c.fail(join(path, "action"), "delay cannot be combined with shadow_mode, which must never hold requests")
		case rpu == 0:
			c.fail(join(path, "action"), "a limit of 0 requests_per_unit rejects every request; it cannot delay")
		}
		switch {
		case ol.MaxDelay == 0:
			c.fail(join(path, "max_delay"), "max_delay is required with action delay (the longest a request may wait, like 2s)")
		case ol.MaxDelay < 0:
			c.fail(join(path, "max_delay"), "max_delay must be greater than 0")
		case ol.MaxDelay > MaxDelay:
			c.fail(join(path, "max_delay"), fmt.Sprintf("max_delay must be at most %s", MaxDelay))
		}
	} else if ol.MaxDelay != 0 {
		c.fail(join(path, "max_delay"), "max_delay applies only to action delay")
	}
	if ol.Status != 0 {
		if msg := rangeProblem("status", int64(ol.Status), 400, 599); msg != "" {
			c.fail(join(path, "status"), msg)
		}
	}
}

// requestDescriptors checks the domain's request_descriptors, including that
// each can reach a rate limit: one that cannot is almost always a typo in a
// key, and would silently limit nothing.
func (c *checker) requestDescriptors(d *Domain) {
	const list = "request_descriptors"
	if len(d.RequestDescriptors) > MaxRequestDescriptors {
		c.fail(list, fmt.Sprintf("a domain may have at most %d request descriptors", MaxRequestDescriptors))
		return
	}
	for i, rd := range d.RequestDescriptors {
		path := index(list, i)
		entries := join(path, "entries")
		switch {
		case len(rd.Entries) == 0:
			c.fail(entries, "entries is required")
			continue
		case len(rd.Entries) > MaxDepth:
			c.fail(entries, fmt.Sprintf("a request descriptor may have at most %d entries (descriptors nest at most %d levels)", MaxDepth, MaxDepth))
			continue
		}
		ok := true
		for j, e := range rd.Entries {
			if !c.requestEntry(e, index(entries, j)) {
				ok = false
			}
		}
		if ok && len(d.Descriptors) > 0 && !reaches(d.Descriptors, rd.Entries) {
			c.fail(path, fmt.Sprintf("no rate limit in descriptors matches a request descriptor with keys %s", keyList(rd.Entries)))
		}
	}
}

// requestEntry checks one entry and reports whether it is usable.
func (c *checker) requestEntry(e RequestEntry, path string) bool {
	n := len(c.problems)
	if e.Key == "" {
		c.fail(join(path, "key"), "key is required")
	}
	c.text(e.Key, join(path, "key"), "key")
	c.text(e.Value, join(path, "value"), "value")
	switch {
	case e.From == "" && e.Value == "":
		c.fail(join(path, "from"), "from is required "+list(sources)+", or a fixed value")
	case e.From != "" && e.Value != "":
		c.fail(join(path, "value"), "an entry takes from or a fixed value, not both")
	case e.From != "" && !slices.Contains(sources, e.From):
		c.fail(join(path, "from"), fmt.Sprintf("%s is not a source %s", quote(string(e.From)), list(sources)))
	case e.From == FromHeader || e.From == FromQuery:
		switch {
		case e.Name == "":
			c.fail(join(path, "name"), fmt.Sprintf("name is required with from: %s (the %s to read)", e.From, map[Source]string{FromHeader: "header", FromQuery: "query parameter"}[e.From]))
		case e.From == FromHeader && !isToken(e.Name):
			c.fail(join(path, "name"), fmt.Sprintf("%s is not a valid HTTP header name", quote(e.Name)))
		}
	case e.Name != "":
		c.fail(join(path, "name"), "name applies only to from: header and from: query")
	}
	return len(c.problems) == n
}

// reaches reports whether a request descriptor built from entries can match
// a rate limit in ds. Entries with a source may carry any value; fixed
// values match as Match would match them.
func reaches(ds []Descriptor, entries []RequestEntry) bool {
	e, last := entries[0], len(entries) == 1
	var candidates []*Descriptor
	if e.From == "" {
		if d := lookupValue(ds, e.Key, e.Value); d != nil {
			candidates = append(candidates, d)
		}
	} else {
		for i := range ds {
			if ds[i].Key == e.Key {
				candidates = append(candidates, &ds[i])
			}
		}
	}
	for _, d := range candidates {
		if last && d.RateLimit != nil || !last && reaches(d.Descriptors, entries[1:]) {
			return true
		}
	}
	return false
}

// lookupValue finds the descriptor of key that value matches, with Match's
// precedence: the exact value, else the most specific matching wildcard
// (the first of equals), else the descriptor without a value.
func lookupValue(ds []Descriptor, key, value string) *Descriptor {
	var wildcard, any *Descriptor
	for i := range ds {
		d := &ds[i]
		if d.Key != key {
			continue
		}
		switch {
		case d.Value == "":
			any = d
		case d.Value == value:
			return d
		case isWildcard(d.Value) && wildcardMatch(d.Value, value):
			if wildcard == nil || literalLen(d.Value) > literalLen(wildcard.Value) {
				wildcard = d
			}
		}
	}
	return cmp.Or(wildcard, any)
}

func keyList(entries []RequestEntry) string {
	keys := make([]string, len(entries))
	for i, e := range entries {
		keys[i] = quote(e.Key)
	}
	return "(" + strings.Join(keys, ", ") + ")"
}

// isToken reports whether s is an HTTP token (RFC 9110), as header names are.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if !('a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", b) >= 0) {
			return false
		}
	}
	return true
}

func algorithmProblem(a Algorithm) string {
	switch {
	case !slices.Contains(algorithms, a):
		return fmt.Sprintf("%s is not an algorithm %s", quote(string(a)), list(algorithms))
	case !slices.Contains(supportedAlgorithms, a):
		return fmt.Sprintf("algorithm %s is not supported yet (supported: %s)", quote(string(a)), strings.Trim(list(supportedAlgorithms), "()"))
	}
	return ""
}

var unitList = list(units)

func unitMessage(u string) string {
	return fmt.Sprintf("%s is not a unit %s", quote(u), unitList)
}

// rangeProblem checks a whole number against its bounds.
func rangeProblem(field string, v, lo, hi int64) string {
	switch {
	case v >= lo && v <= hi:
		return ""
	case lo == 0 && v < 0:
		return field + " must not be negative"
	case lo == 1 && v < 1:
		return field + " must be greater than 0"
	case lo <= 1:
		return fmt.Sprintf("%s must be at most %d", field, hi)
	}
	return fmt.Sprintf("%s must be from %d to %d", field, lo, hi)
}

// pathName is the Lyft-style name of descriptor d under prefix:
// key or key_value, joined to the parent's name with ".".
func pathName(prefix string, d *Descriptor) string {
	seg := d.Key
	if d.Value != "" {
		seg += "_" + d.Value
	}
	if prefix == "" {
		return seg
	}
	return prefix + "." + seg
}

// join and index build paths like descriptors[1].rate_limit.unit.
func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

func index(path string, i int) string {
	return path + "[" + strconv.Itoa(i) + "]"
}

// list formats values as "(a, b, c)" for error messages.
func list[T ~string](values []T) string {
	s := make([]string, len(values))
	for i, v := range values {
		s[i] = string(v)
	}
	return "(" + strings.Join(s, ", ") + ")"
}

// andList and orList format values as "a, b and c" or "a, b or c".
func andList[T ~string](values []T) string { return wordList(values, " and ") }
func orList[T ~string](values []T) string  { return wordList(values, " or ") }

func wordList[T ~string](values []T, last string) string {
	s := make([]string, len(values))
	for i, v := range values {
		s[i] = string(v)
	}
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + last + s[len(s)-1]
}

// quote quotes s for a message, shortening long values so one huge field
// cannot make a huge error.
func quote(s string) string {
	const max = 64
	if len(s) > max {
		cut := max
		for cut > 0 && !isRuneStart(s[cut]) {
			cut--
		}
		return strconv.Quote(s[:cut]) + "…"
	}
	return strconv.Quote(s)
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }
