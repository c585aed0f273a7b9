package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/rules"
)

// The support desk's inspect and reset (POST /api/v1/inspect and
// /api/v1/inspect/reset) run the enforcers' own engine as a library: the
// same matching, the same counter keys and the same limiter scripts, on
// the latest published version, against the counter store the console was
// given (Config.Counters).

// storeTimeout bounds one inspect's or reset's calls to the counter store.
const storeTimeout = 2 * time.Second

// inspector is the engine the support desk matches and reads with; it
// applies each new version when an inspect first needs it.
type inspector struct {
	mu  sync.Mutex // serializes applying a new version
	eng *engine.Engine
}

func newInspector(counters *limiter.Redis, prefix string) *inspector {
	if counters == nil {
		return nil
	}
	return &inspector{eng: engine.New(counters, prefix, engine.WithoutStats())}
}

// errNoCounterStore is the 503 of a console without a counter store.
var errNoCounterStore = httpError(http.StatusServiceUnavailable, "no_counter_store",
	"this console has no counter store: start it with --redis-url (REDIS_URL), the Redis the enforcers count in")

// inspectEngine returns the inspector's engine with the latest published version
// applied.
func (a *API) inspectEngine(ctx context.Context) (*engine.Engine, error) {
	if a.inspector == nil {
		return nil, errNoCounterStore
	}
	v, err := a.store.CurrentVersion(ctx)
	if err != nil {
		return nil, err
	}
	in := a.inspector
	in.mu.Lock()
	defer in.mu.Unlock()
	if v == 0 || in.eng.Version() >= v {
		return in.eng, nil
	}
	snap, err := a.store.FindSnapshot(ctx, v)
	if err != nil {
		return nil, err
	}
	domains := make([]*rules.Domain, 0, len(snap.Domains))
	for _, d := range snap.Domains {
		// What the nodes enforce: the domain's YAML with its overrides.
		dom, err := rules.Parse(d.Name+".yaml", []byte(d.Enforced()))
		if err != nil {
			return nil, fmt.Errorf("parse domain %q of version %d: %w", d.Name, v, err)
		}
		domains = append(domains, dom)
	}
	set, err := rules.Compile(domains)
	if err != nil {
		return nil, fmt.Errorf("compile version %d: %w", v, err)
	}
	if err := in.eng.Apply(snap.Version, set); err != nil {
		return nil, err
	}
	return in.eng, nil
}

// checkDescriptorJSON is one descriptor of a check request, as an
// enforcer receives it.
type checkDescriptorJSON struct {
	Entries []checkEntryJSON `json:"entries"`
}

type checkEntryJSON struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

type inspectRequest struct {
	Domain      string                `json:"domain"`
	Descriptors []checkDescriptorJSON `json:"descriptors"`
}

type resetRequest struct {
	Domain      string                `json:"domain"`
	Descriptors []checkDescriptorJSON `json:"descriptors"`
	Message     string                `json:"message"`
}

// engineRequest is the check request of domain and ds (bounded by the
// engine: see engineError).
func engineRequest(domain string, ds []checkDescriptorJSON) engine.Request {
	req := engine.Request{Domain: domain, Descriptors: make([]engine.Descriptor, len(ds))}
	for i, d := range ds {
		entries := make([]rules.Entry, len(d.Entries))
		for j, e := range d.Entries {
			entries[j] = rules.Entry{Key: e.Key, Value: e.Value}
		}
		req.Descriptors[i].Entries = entries
	}
	return req
}

// engineError maps the engine's refusals of an inspect or reset request
// to 400 and 404; anything else is the counter store failing (503, logged:
// a 5xx does not echo it).
func (a *API) engineError(c *gin.Context, domain string, err error) error {
	switch {
	case errors.Is(err, engine.ErrInvalidRequest):
		return badRequest("%s", strings.TrimPrefix(err.Error(), engine.ErrInvalidRequest.Error()+": "))
	case errors.Is(err, engine.ErrUnknownDomain), errors.Is(err, engine.ErrNoRuleset):
		return httpError(http.StatusNotFound, "not_found", fmt.Sprintf("domain %q is not in the current version", domain))
	case errors.Is(err, context.Canceled) && c.Request.Context().Err() != nil:
		return err
	}
	a.log.WarnContext(c, "counter store failed", "route", c.FullPath(), "request_id", c.GetString("request_id"), "error", err)
	return httpError(http.StatusServiceUnavailable, "counter_store_unavailable", "the counter store did not answer; nothing was changed, try again")
}

// inspectedLimit is one limit of an inspection (InspectedLimit in
// openapi.yaml).
type inspectedLimit struct {
	Descriptor      int       `json:"descriptor"`
	Rule            string    `json:"rule"`
	Algorithm       string    `json:"algorithm"`
	RequestsPerUnit int64     `json:"requests_per_unit"`
	Unit            string    `json:"unit"`
	Used            int64     `json:"used"`
	Remaining       int64     `json:"remaining"`
	ResetAt         time.Time `json:"reset_at"`
	Capacity        int64     `json:"capacity"`
	ShadowMode      bool      `json:"shadow_mode"`
	Unlimited       bool      `json:"unlimited"`
	Shards          int       `json:"shards"`
}

// inspect answers POST /api/v1/inspect: the limits the descriptors match
// and their counters, read without consuming.
func (a *API) inspect(c *gin.Context) error {
	var req inspectRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	ctx := c.Request.Context()
	eng, err := a.inspectEngine(ctx)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	ins, err := eng.Inspect(sctx, engineRequest(req.Domain, req.Descriptors))
	if err != nil {
		return a.engineError(c, req.Domain, err)
	}
	now := time.Now()
	out := make([]inspectedLimit, len(ins.Limits))
	for i, l := range ins.Limits {
		at := l.At
		if at.IsZero() {
			at = now
		}
		alg := l.Limit.Algorithm
		if alg == "" {
			alg = rules.TokenBucket
		}
		out[i] = inspectedLimit{
			Descriptor: l.Descriptor, Rule: l.Limit.Name, Algorithm: string(alg),
			RequestsPerUnit: int64(l.Limit.RequestsPerUnit), Unit: string(l.Limit.Unit),
			Used: l.Used, Remaining: l.Remaining, Capacity: l.Capacity,
			// Rounded up to the millisecond: the counter is full by then.
			ResetAt:    at.Add(l.ResetAfter + time.Millisecond - 1).Truncate(time.Millisecond).UTC(),
			ShadowMode: l.Limit.ShadowMode, Unlimited: l.Limit.Unlimited, Shards: l.Shards,
		}
	}
	c.JSON(http.StatusOK, gin.H{"version": ins.Version, "limits": out})
	return nil
}

// resetLimit names one limit whose counters a reset deleted.
type resetLimit struct {
	Descriptor int    `json:"descriptor"`
	Rule       string `json:"rule"`
}

// resetCounters answers POST /api/v1/inspect/reset: the counters of the
// limits the descriptors match start afresh, audited as counter.reset.
func (a *API) resetCounters(c *gin.Context) error {
	var req resetRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	message, err := freeText("message", req.Message, true)
	if err != nil {
		return err
	}
	ctx := c.Request.Context()
	eng, err := a.inspectEngine(ctx)
	if err != nil {
		return err
	}
	ins, err := eng.Limits(engineRequest(req.Domain, req.Descriptors))
	if err != nil {
		return a.engineError(c, req.Domain, err)
	}
	// A role held for some domains only resets counters in those, checked
	// before any counter is touched.
	if err := a.requireDomains(c, req.Domain); err != nil {
		return err
	}
	var limits []resetLimit
	for _, l := range ins.Limits {
		if l.Counted() {
			limits = append(limits, resetLimit{Descriptor: l.Descriptor, Rule: l.Limit.Name})
		}
	}
	if len(limits) == 0 {
		return httpError(http.StatusUnprocessableEntity, "no_limit",
			fmt.Sprintf("the descriptors match no counted limit of domain %q in version %d: there is nothing to reset", req.Domain, ins.Version))
	}
	detail := gin.H{"version": ins.Version, "descriptors": req.Descriptors, "limits": limits}
	var deleted int64
	var storeErr error
	err = a.store.ResetCounters(ctx, a.actor(c), req.Domain, message, detail, func(ctx context.Context) error {
		sctx, cancel := context.WithTimeout(ctx, storeTimeout)
		defer cancel()
		deleted, storeErr = eng.Reset(sctx, ins)
		return storeErr
	})
	if storeErr != nil {
		return a.engineError(c, req.Domain, storeErr)
	}
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, gin.H{"version": ins.Version, "limits": limits, "keys": deleted})
	return nil
}
