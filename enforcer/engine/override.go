package engine

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/rules"
)

// MaxOverridePeriod is the longest period a limit override may ask for:
// one year, the longest unit. A longer one (Envoy's multiplier times its
// unit) is refused as an invalid request: before this bound, YEAR ×
// 4294967295 overflowed nothing visible but made keys that lived 16 years,
// and SECOND × 4294967295 asked for 136.
const MaxOverridePeriod = 365 * 24 * time.Hour

// overrideLimit builds the limit a caller's Override asks for. matched is
// the limit the rules chose (nil if none): the override keeps its name,
// failure mode and algorithm; without one it counts with def, the domain's
// default algorithm (so a Lyft file counts an override in a fixed window,
// as Lyft does). Following envoyproxy/ratelimit, an override is never in
// shadow mode. Its counter is its own (see overrideKey).
func overrideLimit(domain string, o *Override, matched *rules.Limit, def rules.Algorithm) (*rules.Limit, error) {
	if o.RequestsPerUnit == 0 {
		return nil, errors.New("limit override: requests_per_unit must be positive")
	}
	period := o.Unit.Period()
	if period <= 0 {
		return nil, fmt.Errorf("limit override: unit %q is not supported", o.Unit)
	}
	if o.Multiplier > 1 {
		// Compare before multiplying, so nothing can overflow.
		if time.Duration(o.Multiplier) > MaxOverridePeriod/period {
			return nil, fmt.Errorf("limit override: %d × %s is over the longest period allowed (%s)", o.Multiplier, o.Unit, "1 year")
		}
		period *= time.Duration(o.Multiplier)
	}
	if period > MaxOverridePeriod {
		return nil, fmt.Errorf("limit override: %s is over the longest period allowed (%s)", o.Unit, "1 year")
	}
	l := &rules.Limit{
		Domain:          domain,
		Name:            rules.OverrideName,
		Unit:            o.Unit,
		RequestsPerUnit: o.RequestsPerUnit,
		Burst:           o.RequestsPerUnit,
		Algorithm:       cmp.Or(def, rules.TokenBucket),
		FailureMode:     rules.FailOpen,
		Period:          period,
		Shards:          1,
		OnLimit:         rules.OnLimit{Action: rules.Reject, Status: rules.DefaultStatus},
	}
	if matched != nil {
		l.Name = matched.Name
		l.FailureMode = matched.FailureMode
		l.DetailedMetric = matched.DetailedMetric
		l.OnLimit.Status = matched.OnLimit.Status
		l.Algorithm = cmp.Or(matched.Algorithm, l.Algorithm)
	}
	if l.Algorithm == rules.SlidingWindowLog && l.RequestsPerUnit > rules.MaxSlidingLogRequests {
		// A log keeps an entry per request: the rules bound it, and a
		// caller's override must not get round that.
		l.Algorithm = rules.SlidingWindowCounter
	}
	return l, nil
}
