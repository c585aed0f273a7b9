package api

import (
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice/rules"
)

// domainList is GET /api/v1/domains' answer, cached per ruleset version. A
// version never changes once written, so the answer for the head version
// stays right until the next publish, on every replica. Limit counts are
// kept per (domain, version it last changed): after a publish only the
// domains it changed are parsed again (listing 12 domains of 1 MB parsed
// 12 MB of YAML on every request before).
type domainList struct {
	mu      sync.Mutex
	version int64
	list    []domainSummary
	limits  map[domainAt]int
	parses  atomic.Int64 // domains parsed, for tests
}

// domainAt names a domain's content: the domain at the version it last
// changed.
type domainAt struct {
	name    string
	version int64
}

// cached returns the list for version v, if that is the one held.
func (l *domainList) cached(v int64) ([]domainSummary, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.list, l.list != nil && l.version == v
}

// limitsOf returns the number of limits of domain name as of version,
// parsing src only when that revision was not counted before.
func (l *domainList) limitsOf(name string, version int64, src string) int {
	l.mu.Lock()
	n, ok := l.limits[domainAt{name, version}]
	l.mu.Unlock()
	if ok {
		return n
	}
	l.parses.Add(1)
	if dom, err := rules.Parse(name+".yaml", []byte(src)); err == nil {
		n = len(limitsOf(dom))
	}
	return n
}

// store keeps list as version v's answer, with the limit counts of the
// domains in it (counts of revisions no longer listed are let go). A slower
// request for an older version never replaces a newer one.
func (l *domainList) store(v int64, list []domainSummary) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.list != nil && v < l.version {
		return
	}
	limits := make(map[domainAt]int, len(list))
	for _, d := range list {
		limits[domainAt{d.Name, d.Version}] = d.Limits
	}
	l.version, l.list, l.limits = v, list, limits
}
