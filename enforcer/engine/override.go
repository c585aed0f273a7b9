package engine

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/rules"
)

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
		period *= time.Duration(o.Multiplier)
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
