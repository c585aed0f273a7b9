// Package lyft translates Sluice's rules into envoyproxy/ratelimit's xDS
// configuration (ratelimit.config.ratelimit.v3.RateLimitConfig), keeping
// Lyft's semantics, and says why when a domain cannot be. It does no I/O.
package lyft

import (
	"fmt"
	"strings"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/rules"
)

// maxReasons bounds the reasons Translate gives for one domain; the rest
// are counted.
const maxReasons = 5

// lyftUnits are the units envoyproxy/ratelimit's xDS configuration has.
var lyftUnits = map[rules.Unit]rlsconf.RateLimitUnit{
	rules.Second: rlsconf.RateLimitUnit_SECOND,
	rules.Minute: rlsconf.RateLimitUnit_MINUTE,
	rules.Hour:   rlsconf.RateLimitUnit_HOUR,
	rules.Day:    rlsconf.RateLimitUnit_DAY,
}

// Translate returns domain d as envoyproxy/ratelimit's xDS resource, with
// Lyft's semantics: every limit counts in a fixed window aligned to its
// unit, as Sluice's fixed_window does. When d uses anything Lyft cannot
// express (another algorithm, burst, unit_multiplier, a unit longer than a
// day, shards, leases, async consistency, global scope, failure_mode closed or local, on_limit delay or
// status, share_threshold, a "*" before a value's end, overlapping
// wildcards), it returns nil and why, one reason per descriptor path (at
// most maxReasons, then a count): such a domain is never sent as if Lyft
// could run it.
//
// Overrides become descriptors of their own exact values, with the
// override's rate: Lyft keys its counters by the request's entries, so a
// customer's usage carries over when an override starts or ends, as it
// does in Sluice. Request descriptors (gateway mode) and value_to_metric
// and metadata (reporting only) are left out: they change nothing Lyft
// enforces.
func Translate(d *rules.Domain) (*rlsconf.RateLimitConfig, []string) {
	t := translator{domain: d}
	out := &rlsconf.RateLimitConfig{Name: d.Name, Domain: d.Name, Descriptors: t.level(d.Descriptors, "")}
	for i, o := range d.Overrides {
		t.override(out, o, fmt.Sprintf("overrides[%d]", i))
	}
	if len(t.reasons) > 0 {
		reasons := t.reasons
		if len(reasons) > maxReasons {
			reasons = append(reasons[:maxReasons:maxReasons], fmt.Sprintf("%d more", len(t.reasons)-maxReasons))
		}
		return nil, reasons
	}
	return out, nil
}

type translator struct {
	domain  *rules.Domain
	reasons []string
}

func (t *translator) fail(path, format string, args ...any) {
	t.reasons = append(t.reasons, path+": "+fmt.Sprintf(format, args...))
}

func (t *translator) level(ds []rules.Descriptor, parent string) []*rlsconf.RateLimitDescriptor {
	if len(ds) == 0 {
		return nil
	}
	list := "descriptors"
	if parent != "" {
		list = parent + ".descriptors"
	}
	out := make([]*rlsconf.RateLimitDescriptor, len(ds))
	for i := range ds {
		out[i] = t.descriptor(&ds[i], fmt.Sprintf("%s[%d]", list, i))
	}
	t.wildcards(ds, list)
	return out
}

func (t *translator) descriptor(d *rules.Descriptor, path string) *rlsconf.RateLimitDescriptor {
	if i := strings.IndexByte(d.Value, '*'); i >= 0 && i != len(d.Value)-1 {
		t.fail(path, "value %q has a \"*\" before its end; Lyft's wildcards are prefixes (one \"*\" at the end)", d.Value)
	}
	if d.ShareThreshold {
		t.fail(path, "share_threshold is not in Lyft's xDS configuration")
	}
	out := &rlsconf.RateLimitDescriptor{Key: d.Key, Value: d.Value, ShadowMode: d.ShadowMode, DetailedMetric: d.DetailedMetric}
	if rl := d.RateLimit; rl != nil {
		out.RateLimit = t.limit(d, path)
	}
	out.Descriptors = t.level(d.Descriptors, path)
	return out
}

// limit translates d's rate limit, noting what Lyft cannot express.
func (t *translator) limit(d *rules.Descriptor, path string) *rlsconf.RateLimitPolicy {
	rl := d.RateLimit
	out := &rlsconf.RateLimitPolicy{Unlimited: rl.Unlimited, Name: rl.Name}
	for _, r := range rl.Replaces {
		out.Replaces = append(out.Replaces, &rlsconf.RateLimitReplace{Name: r})
	}
	if rl.Unlimited {
		return out // Lyft refuses a unit on an unlimited limit
	}
	out.RequestsPerUnit = rl.RequestsPerUnit
	if u, ok := lyftUnits[rl.Unit]; ok {
		out.Unit = u
	} else {
		t.fail(path, "unit %s; Lyft's xDS configuration has second, minute, hour and day", rl.Unit)
	}
	if rl.UnitMultiplier > 1 {
		t.fail(path, "unit_multiplier %d is not in Lyft's xDS configuration", rl.UnitMultiplier)
	}
	if alg := t.algorithm(d); alg != rules.FixedWindow {
		t.fail(path, "counts with %s; Lyft counts in fixed windows only (use fixed_window)", alg)
	}
	if d.Burst > 0 {
		t.fail(path, "burst %d; Lyft has no bursts", d.Burst)
	}
	if d.Shards > 1 {
		t.fail(path, "shards %d; Lyft counts each limit in one key", d.Shards)
	}
	if d.Lease {
		t.fail(path, "lease: true; Lyft has no leases")
	}
	if d.Consistency == rules.Async {
		t.fail(path, "consistency: async; Lyft asks Redis for every request")
	}
	if d.Scope == rules.ScopeGlobal {
		t.fail(path, "scope: global; Lyft has no regions")
	}
	switch d.FailureMode {
	case rules.FailClosed, rules.FailLocal:
		t.fail(path, "failure_mode %s; Lyft answers an error when Redis fails, and Envoy's failure_mode_deny decides for every limit", d.FailureMode)
	}
	if o := d.OnLimit; o != nil {
		if o.Action == rules.Delay {
			t.fail(path, "on_limit delay; Lyft only rejects")
		}
		if o.Status != 0 && o.Status != rules.DefaultStatus {
			t.fail(path, "on_limit status %d; Lyft's answer carries no status (Envoy's filter sets it)", o.Status)
		}
	}
	return out
}

// algorithm is the algorithm d's limit counts with.
func (t *translator) algorithm(d *rules.Descriptor) rules.Algorithm {
	switch {
	case d.Algorithm != "":
		return d.Algorithm
	case t.domain.DefaultAlgorithm != "":
		return t.domain.DefaultAlgorithm
	}
	return rules.TokenBucket
}

// wildcards notes wildcards of one key at one level that can match the
// same value: Lyft takes the first in the file, Sluice the most specific.
func (t *translator) wildcards(ds []rules.Descriptor, list string) {
	for i := range ds {
		a := ds[i].Value
		if !strings.HasSuffix(a, "*") {
			continue
		}
		for j := i + 1; j < len(ds); j++ {
			b := ds[j].Value
			if ds[j].Key != ds[i].Key || !strings.HasSuffix(b, "*") {
				continue
			}
			pa, pb := a[:len(a)-1], b[:len(b)-1]
			if strings.HasPrefix(pa, pb) || strings.HasPrefix(pb, pa) {
				t.fail(fmt.Sprintf("%s[%d]", list, j), "wildcards %q and %q overlap; Lyft takes the first that matches, Sluice the most specific", a, b)
			}
		}
	}
}

// override adds o to the translated tree out as descriptors of o's exact
// values: at each entry, the descriptor the value matches is copied to one
// of that exact value unless it is one already, and the last gets o's
// rate. Lyft prefers an exact value to a wildcard or a key alone, as
// Sluice does, and keys counters by the request's entries either way.
func (t *translator) override(out *rlsconf.RateLimitConfig, o rules.Override, path string) {
	u, ok := lyftUnits[o.Unit]
	if !ok {
		t.fail(path, "unit %s; Lyft's xDS configuration has second, minute, hour and day", o.Unit)
		return
	}
	level := &out.Descriptors
	for i, e := range o.Entries {
		d := lookup(*level, e.Key, e.Value)
		if d == nil {
			// Parse refuses overrides that match no limit.
			t.fail(path, "matches no limit")
			return
		}
		if d.Value != e.Value {
			d = proto.Clone(d).(*rlsconf.RateLimitDescriptor)
			d.Value = e.Value
			*level = append(*level, d)
		}
		if i == len(o.Entries)-1 {
			if d.RateLimit == nil {
				t.fail(path, "matches no limit")
				return
			}
			d.RateLimit.Unlimited = false
			d.RateLimit.Unit, d.RateLimit.RequestsPerUnit = u, o.RequestsPerUnit
		}
		level = &d.Descriptors
	}
}

// lookup finds the descriptor of key that value matches, with Sluice's
// precedence (rules.Set): the exact value, else the longest matching
// wildcard prefix, else the key without a value.
func lookup(ds []*rlsconf.RateLimitDescriptor, key, value string) *rlsconf.RateLimitDescriptor {
	var wildcard, any *rlsconf.RateLimitDescriptor
	for _, d := range ds {
		switch {
		case d.Key != key:
		case d.Value == "":
			any = d
		case d.Value == value:
			return d
		case strings.HasSuffix(d.Value, "*") && strings.HasPrefix(value, d.Value[:len(d.Value)-1]):
			if wildcard == nil || len(d.Value) > len(wildcard.Value) {
				wildcard = d
			}
		}
	}
	if wildcard != nil {
		return wildcard
	}
	return any
}
