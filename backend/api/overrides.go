package api

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules"
)

// Bounds of an override's entries.
const (
	maxOverrideKey   = 256
	maxOverrideValue = 1024
)

type overrideRequest struct {
	Domain    string             `json:"domain"`
	Entries   []rules.Entry      `json:"entries"`
	RateLimit store.OverrideRate `json:"rate_limit"`
	ExpiresAt string             `json:"expires_at"`
	Message   string             `json:"message"`
	Urgent    bool               `json:"urgent"`
}

// spec checks req's shape (400) and its expiry (422) and returns it as the
// store takes it.
func (req overrideRequest) spec(now time.Time) (store.OverrideSpec, error) {
	if !domainName.MatchString(req.Domain) {
		return store.OverrideSpec{}, badRequest("domain names use letters, digits, '_', '.', '-' (at most 128)")
	}
	switch n := len(req.Entries); {
	case n == 0:
		return store.OverrideSpec{}, badRequest("entries needs at least one entry: the request descriptor to override")
	case n > rules.MaxDepth:
		return store.OverrideSpec{}, badRequest("entries has %d entries; a descriptor matches at most %d", n, rules.MaxDepth)
	}
	for i, e := range req.Entries {
		switch {
		case e.Key == "" || e.Value == "":
			return store.OverrideSpec{}, badRequest("entries[%d] needs a key and a value: an override is for one exact descriptor", i)
		case len(e.Key) > maxOverrideKey:
			return store.OverrideSpec{}, badRequest("entries[%d].key is over %d bytes", i, maxOverrideKey)
		case len(e.Value) > maxOverrideValue:
			return store.OverrideSpec{}, badRequest("entries[%d].value is over %d bytes", i, maxOverrideValue)
		}
	}
	switch u := rules.Unit(req.RateLimit.Unit); {
	case u == "":
		return store.OverrideSpec{}, badRequest("rate_limit.unit is required")
	case u.Period() == 0:
		return store.OverrideSpec{}, badRequest("rate_limit.unit must be second, minute, hour, day, week, month or year, not %q", req.RateLimit.Unit)
	}
	if req.RateLimit.RequestsPerUnit > rules.MaxRequestsPerUnit {
		return store.OverrideSpec{}, badRequest("rate_limit.requests_per_unit is over %d", rules.MaxRequestsPerUnit)
	}
	msg, err := checkMessage(req.Message)
	if err != nil {
		return store.OverrideSpec{}, err
	}
	if req.ExpiresAt == "" {
		return store.OverrideSpec{}, badRequest("expires_at is required (RFC 3339)")
	}
	at, err := time.Parse(time.RFC3339, req.ExpiresAt)
	if err != nil {
		return store.OverrideSpec{}, badRequest("expires_at must be an RFC 3339 time like 2026-12-04T17:00:00Z")
	}
	switch {
	case !at.After(now):
		return store.OverrideSpec{}, unprocessable("expires_at %s is not in the future", at.UTC().Format(time.RFC3339))
	case at.Sub(now) > store.MaxOverrideLifetime:
		return store.OverrideSpec{}, unprocessable("expires_at %s is more than %d days away", at.UTC().Format(time.RFC3339), int(store.MaxOverrideLifetime/(24*time.Hour)))
	}
	return store.OverrideSpec{Domain: req.Domain, Entries: req.Entries, RateLimit: req.RateLimit, ExpiresAt: at.UTC(),
		Message: msg, Urgent: req.Urgent}, nil
}

func unprocessable(format string, args ...any) *apiError {
	return httpError(http.StatusUnprocessableEntity, "unprocessable", fmt.Sprintf(format, args...))
}

// mayOverride is where a caller's right to override in domain is decided
// beyond their role (which the route checks: support or higher). Every
// override write goes through it, so a grant limited to some domains
// applies here.
func (a *API) mayOverride(c *gin.Context, domain string) error {
	if p := caller(c); p == nil || roleRank[p.role] < roleRank[store.RoleSupport] {
		return httpError(http.StatusForbidden, "forbidden", "overrides need the support role or higher")
	}
	return a.requireDomains(c, domain)
}

// createOverride publishes a temporary override, or proposes it (202) when
// approval is required and it is not urgent.
func (a *API) createOverride(c *gin.Context) error {
	var req overrideRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	spec, err := req.spec(time.Now())
	if err != nil {
		return err
	}
	if err := a.mayOverride(c, spec.Domain); err != nil {
		return err
	}
	act := a.actor(c)
	id, v, err := a.store.CreateOverride(c.Request.Context(), spec, act)
	if errors.Is(err, store.ErrApprovalRequired) {
		cr, err := a.store.Propose(c.Request.Context(), store.Change{Kind: store.KindOverride, Domain: spec.Domain,
			Override: &spec, Message: spec.Message, Actor: act})
		if err != nil {
			return err
		}
		c.JSON(http.StatusAccepted, gin.H{"change": cr})
		return nil
	}
	if err != nil {
		return err
	}
	a.notify(c)
	c.JSON(http.StatusCreated, gin.H{"id": id, "version": v})
	return nil
}

func (a *API) listOverrides(c *gin.Context) error {
	cursor, limit, err := page(c)
	if err != nil {
		return err
	}
	f := store.OverrideFilter{Domain: c.Query("domain"), Status: c.Query("status"), Before: cursor, Limit: limit}
	if f.Domain != "" && !domainName.MatchString(f.Domain) {
		return badRequest("domain names use letters, digits, '_', '.', '-' (at most 128)")
	}
	switch f.Status {
	case "", store.OverrideActive, store.OverrideExpired, store.OverrideEnded:
	default:
		return badRequest("status must be active, expired or ended")
	}
	ovs, next, err := a.store.ListOverrides(c.Request.Context(), f)
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, gin.H{"overrides": ovs, "next_cursor": nextCursor(next)})
	return nil
}

func (a *API) getOverride(c *gin.Context) error {
	id, err := pathInt(c, "id")
	if err != nil {
		return err
	}
	o, err := a.store.FindOverride(c.Request.Context(), id)
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, o)
	return nil
}

// endOverride publishes a version without an active override.
func (a *API) endOverride(c *gin.Context) error {
	id, msg, err := pathAndMessage(c)
	if err != nil {
		return err
	}
	o, err := a.store.FindOverride(c.Request.Context(), id)
	if err != nil {
		return err
	}
	if err := a.mayOverride(c, o.Domain); err != nil {
		return err
	}
	v, err := a.store.EndOverride(c.Request.Context(), id, store.OverrideEnded, msg, a.actor(c))
	if err != nil {
		return err
	}
	a.notify(c)
	c.JSON(http.StatusOK, gin.H{"version": v})
	return nil
}
