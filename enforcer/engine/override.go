package engine

import (
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
// the limit the rules chose (nil if none): the override keeps its name and
// failure mode. Following envoyproxy/ratelimit, an override is never in
// shadow mode.
func overrideLimit(domain string, o *Override, matched *rules.Limit) (*rules.Limit, error) {
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
		Name:            "override",
		Unit:            o.Unit,
		RequestsPerUnit: o.RequestsPerUnit,
		Burst:           o.RequestsPerUnit,
		Algorithm:       rules.TokenBucket,
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
	}
	return l, nil
}
