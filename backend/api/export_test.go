package api

import (
	"sort"
	"time"
)

// Routes lists every registered route as "METHOD /path/:param", sorted.
func (a *API) Routes() []string {
	var out []string
	for _, r := range a.engine.Routes() {
		out = append(out, r.Method+" "+r.Path)
	}
	sort.Strings(out)
	return out
}

// DomainParses is how many domains GET /api/v1/domains has parsed.
func (a *API) DomainParses() int64 { return a.domains.parses.Load() }

// NewTestThrottle returns the in-process sign-in throttle on a clock the
// test controls.
func NewTestThrottle(now func() time.Time) Throttle { return newThrottle(now) }

// ReturnPath is returnPath, for its table test.
func ReturnPath(s string) string { return returnPath(s) }
