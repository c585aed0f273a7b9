package gateway

import (
	"sync/atomic"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/middleware"
	"github.com/sluicehq/sluice/rules"
)

// specCache keeps the request descriptors of the applied ruleset, derived
// once per ruleset version instead of per request.
type specCache struct {
	eng     *engine.Engine
	domain  string
	derive  func(set *rules.Set, domain string) []middleware.RequestDescriptor
	current atomic.Pointer[specEntry]
}

type specEntry struct {
	set   *rules.Set
	specs []middleware.RequestDescriptor
}

func newSpecCache(eng *engine.Engine, domain string, derive func(*rules.Set, string) []middleware.RequestDescriptor) *specCache {
	return &specCache{eng: eng, domain: domain, derive: derive}
}

func (c *specCache) get() []middleware.RequestDescriptor {
	set, _ := c.eng.Ruleset()
	if e := c.current.Load(); e != nil && e.set == set {
		return e.specs
	}
	var specs []middleware.RequestDescriptor
	if c.derive != nil && set != nil {
		specs = c.derive(set, c.domain)
	}
	if len(specs) == 0 || middleware.Validate(specs) != nil {
		specs = middleware.DefaultDescriptors
	}
	c.current.Store(&specEntry{set: set, specs: specs})
	return specs
}
