package engine

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/rules"
)

// Policy is how the enforcer applies one limit beyond counting it.
type Policy struct {
	// Shards splits the limit's counter over that many Redis keys, each
	// holding 1/Shards of the limit (rounded up), for a single descriptor
	// value (a tenant) hotter than one Redis key can serve. Each request
	// counts against one shard, picked round robin by each node. 0 and 1
	// mean one key.
	//
	// Error bound: the shards together admit at most Shards × ⌈limit/Shards⌉
	// < limit + Shards requests per period (and likewise for the burst), so
	// a sharded limit over-admits by fewer than Shards requests. It can
	// under-admit while load is uneven across shards: a request is rejected
	// when its shard is empty even if another still has room. With round
	// robin from each node the shards stay within a few requests of each
	// other, so a client sees at most about Shards early rejections per
	// period.
	Shards int
	// OnLimit says what an HTTP front (the gateway, the Go middleware)
	// does with a request over this limit.
	OnLimit OnLimit
}

// Action is what happens to a request over its limit.
type Action string

// Actions of OnLimit.
const (
	// Reject answers the request at once (429 by default).
	Reject Action = "reject"
	// Delay holds the request until the limit lets it through, at most
	// MaxDelay; after that it is rejected.
	Delay Action = "delay"
)

// OnLimit is a limit's on_limit setting.
type OnLimit struct {
	Action   Action
	MaxDelay time.Duration
	// Status is the HTTP status of a rejection (429 when zero).
	Status int
}

// DefaultPolicy is the policy of a limit that says nothing: one key, reject
// with 429.
var DefaultPolicy = Policy{Shards: 1, OnLimit: OnLimit{Action: Reject, Status: http.StatusTooManyRequests}}

// PolicyOf derives a limit's Policy from the rules. The rule language does
// not carry shards and on_limit yet, so every limit gets DefaultPolicy
// (WithPolicies overrides this); once rules.Limit has those fields, this is
// where they are read.
func PolicyOf(l *rules.Limit) Policy {
	return DefaultPolicy
}

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
	}
	if matched != nil {
		l.Name = matched.Name
		l.FailureMode = matched.FailureMode
		l.DetailedMetric = matched.DetailedMetric
	}
	return l, nil
}
