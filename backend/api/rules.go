package api

import (
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules"
)

var domainName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,128}$`)

func domainParam(c *gin.Context) (string, error) {
	d := c.Param("domain")
	if !domainName.MatchString(d) {
		return "", badRequest("domain names use letters, digits, '_', '.', '-' (at most 128)")
	}
	return d, nil
}

func (a *API) getRuleset(c *gin.Context) error {
	snap, err := a.store.FindSnapshot(c.Request.Context(), 0)
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, snap)
	return nil
}

// domainSummary is a domain in the list: when and by whom it last changed,
// and how many limits it has.
type domainSummary struct {
	Name      string `json:"name"`
	Version   int64  `json:"version"`
	ChangedAt string `json:"changed_at"`
	Author    string `json:"author"`
	Message   string `json:"message"`
	Limits    int    `json:"limits"`
}

func (a *API) listDomains(c *gin.Context) error {
	ctx := c.Request.Context()
	head, err := a.store.CurrentVersion(ctx)
	if err != nil {
		return err
	}
	if out, ok := a.domains.cached(head); ok {
		c.JSON(http.StatusOK, gin.H{"version": head, "domains": out})
		return nil
	}
	snap, err := a.store.FindSnapshot(ctx, 0)
	if err != nil {
		return err
	}
	out := make([]domainSummary, len(snap.Domains))
	for i, d := range snap.Domains {
		out[i] = domainSummary{Name: d.Name, Version: d.Version, ChangedAt: d.ChangedAt.Format(timeFormat),
			Author: d.Author, Message: d.Message, Limits: a.domains.limitsOf(d.Name, d.Version, d.YAML)}
	}
	a.domains.store(snap.Version, out)
	c.JSON(http.StatusOK, gin.H{"version": snap.Version, "domains": out})
	return nil
}

func (a *API) getDomain(c *gin.Context) error {
	name, err := domainParam(c)
	if err != nil {
		return err
	}
	d, err := a.store.FindDomain(c.Request.Context(), name)
	if err != nil {
		return err
	}
	current, err := a.store.CurrentVersion(c.Request.Context())
	if err != nil {
		return err
	}
	body := gin.H{"name": d.Name, "yaml": d.YAML, "version": d.Version, "current_version": current,
		"changed_at": d.ChangedAt, "author": d.Author, "message": d.Message}
	dom, err := rules.Parse(name+".yaml", []byte(d.YAML))
	var ve *rules.ValidationError
	switch {
	case err == nil:
		body["config"], body["limits"] = domainConfig(dom), limitsOf(dom)
	case errors.As(err, &ve):
		// Stored rules were valid when published; a stricter parser since
		// then is the only way here. Show the YAML and say what is wrong.
		body["config"], body["limits"], body["problems"] = nil, []limitJSON{}, ve.Details()
	default:
		return err
	}
	c.JSON(http.StatusOK, body)
	return nil
}

type publishRequest struct {
	YAML             string `json:"yaml"`
	Message          string `json:"message"`
	BaseVersion      int64  `json:"base_version"`
	BreakGlassReason string `json:"break_glass_reason"`
	// Rollout stages the version to the nodes it selects (rollout.go).
	Rollout *store.RolloutSpec `json:"rollout"`
}

func checkMessage(m string) (string, error) { return freeText("message", m, true) }

// putDomain validates a domain's YAML and publishes it as a new version, or
// proposes it when approval is required.
func (a *API) putDomain(c *gin.Context) error {
	name, err := domainParam(c)
	if err != nil {
		return err
	}
	var req publishRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	msg, err := checkMessage(req.Message)
	if err != nil {
		return err
	}
	if err := checkRollout(req.Rollout); err != nil {
		return err
	}
	if err := validateDomain(name, req.YAML); err != nil {
		return err
	}
	return a.submit(c, store.Change{Kind: store.KindPublish, Domain: name, YAML: req.YAML, BaseVersion: req.BaseVersion,
		Message: msg, BreakGlass: req.BreakGlassReason, Rollout: req.Rollout})
}

// validateDomain parses and compiles a domain; its name must match the URL.
func validateDomain(name, src string) error {
	d, err := rules.Parse(name+".yaml", []byte(src))
	if err != nil {
		return err
	}
	if d.Name != name {
		return &rules.ValidationError{Problems: []rules.Problem{{File: name + ".yaml", Line: 1, Column: 1, Path: "domain",
			Message: "domain " + strconv.Quote(d.Name) + " does not match the URL's " + strconv.Quote(name)}}}
	}
	if len(d.Overrides) > 0 {
		// The console composes this section from its temporary overrides
		// (POST /api/v1/overrides); a domain's own YAML never holds one.
		line := 1
		for i, l := range strings.Split(src, "\n") {
			if strings.HasPrefix(l, "overrides:") {
				line = i + 1
				break
			}
		}
		return &rules.ValidationError{Problems: []rules.Problem{{File: name + ".yaml", Line: line, Column: 1, Path: "overrides",
			Message: "overrides are managed by the console: create them with POST /api/v1/overrides (sluice ctl overrides create) and remove this section"}}}
	}
	if _, err := rules.Compile([]*rules.Domain{d}); err != nil {
		return err
	}
	return nil
}

type deleteRequest struct {
	Message          string `json:"message"`
	BaseVersion      int64  `json:"base_version"`
	BreakGlassReason string `json:"break_glass_reason"`
}

func (a *API) deleteDomain(c *gin.Context) error {
	name, err := domainParam(c)
	if err != nil {
		return err
	}
	var req deleteRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	msg, err := checkMessage(req.Message)
	if err != nil {
		return err
	}
	return a.submit(c, store.Change{Kind: store.KindDelete, Domain: name, BaseVersion: req.BaseVersion, Message: msg,
		BreakGlass: req.BreakGlassReason})
}

type domainRollbackRequest struct {
	ToVersion        int64  `json:"to_version"`
	Message          string `json:"message"`
	BaseVersion      int64  `json:"base_version"`
	BreakGlassReason string `json:"break_glass_reason"`
}

// rollbackDomain publishes a version in which one domain is as it was at
// to_version (absent if it did not exist then).
func (a *API) rollbackDomain(c *gin.Context) error {
	name, err := domainParam(c)
	if err != nil {
		return err
	}
	var req domainRollbackRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if req.ToVersion <= 0 {
		return badRequest("to_version must be a positive integer")
	}
	msg, err := checkMessage(req.Message)
	if err != nil {
		return err
	}
	return a.submit(c, store.Change{Kind: store.KindDomainRollback, Domain: name, RollbackTo: req.ToVersion,
		BaseVersion: req.BaseVersion, Message: msg, BreakGlass: req.BreakGlassReason})
}

// submit publishes ch and answers 200 {"version"} (plus "rollback_of" for
// rollbacks). When approval is required it proposes ch instead and answers
// 202 {"change"}. Only admins may break glass.
func (a *API) submit(c *gin.Context, ch store.Change) error {
	var err error
	if ch.BreakGlass, err = freeText("break_glass_reason", ch.BreakGlass, false); err != nil {
		return err
	}
	if ch.BreakGlass != "" && caller(c).role != store.RoleAdmin {
		return httpError(http.StatusForbidden, "forbidden", "only admins may break glass")
	}
	if err := a.requireChange(c, ch); err != nil {
		return err
	}
	ch.Actor = a.actor(c)
	v, err := a.store.Publish(c.Request.Context(), ch)
	if errors.Is(err, store.ErrApprovalRequired) {
		cr, err := a.store.Propose(c.Request.Context(), ch)
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
	body := gin.H{"version": v}
	if ch.Kind == store.KindRollback || ch.Kind == store.KindDomainRollback {
		body["rollback_of"] = ch.RollbackTo
	}
	if ch.Rollout != nil {
		body["rollout"] = gin.H{"state": store.RolloutStaged, "labels": ch.Rollout.Labels}
	}
	c.JSON(http.StatusOK, body)
	return nil
}

// notify pushes the new version to this console's nodes. The publish has
// committed already, so a failure here is logged, not returned: nodes also
// catch up when they reconnect.
func (a *API) notify(c *gin.Context) {
	if err := a.hub.Notify(c.Request.Context()); err != nil {
		a.log.WarnContext(c, "push new version", "error", err)
	}
}

func (a *API) listVersions(c *gin.Context) error {
	cursor, limit, err := page(c)
	if err != nil {
		return err
	}
	f := store.VersionFilter{Domain: c.Query("domain"), Author: c.Query("author"), Before: cursor, Limit: limit}
	if f.Since, err = queryTime(c, "since"); err != nil {
		return err
	}
	if f.Until, err = queryTime(c, "until"); err != nil {
		return err
	}
	vs, next, err := a.store.ListVersions(c.Request.Context(), f)
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, gin.H{"versions": a.withApplied(c, vs...), "next_cursor": nextCursor(next)})
	return nil
}

func (a *API) getVersion(c *gin.Context) error {
	n, err := pathInt(c, "n")
	if err != nil {
		return err
	}
	meta, err := a.store.FindVersion(c.Request.Context(), n)
	if err != nil {
		return err
	}
	snap, err := a.store.FindSnapshot(c.Request.Context(), n)
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, gin.H{"version": a.withApplied(c, meta)[0], "domains": snap.Domains})
	return nil
}

type rollbackRequest struct {
	Message          string `json:"message"`
	BaseVersion      int64  `json:"base_version"`
	BreakGlassReason string `json:"break_glass_reason"`
}

// rollback publishes a new version whose content is version n's.
func (a *API) rollback(c *gin.Context) error {
	n, err := pathInt(c, "n")
	if err != nil {
		return err
	}
	var req rollbackRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	msg, err := checkMessage(req.Message)
	if err != nil {
		return err
	}
	return a.submit(c, store.Change{Kind: store.KindRollback, RollbackTo: n, BaseVersion: req.BaseVersion, Message: msg,
		BreakGlass: req.BreakGlassReason})
}

func (a *API) listAudit(c *gin.Context) error {
	f, err := auditFilter(c)
	if err != nil {
		return err
	}
	switch format := c.DefaultQuery("format", "json"); format {
	case "csv":
		return a.exportAudit(c, f)
	case "json":
	default:
		return badRequest("format must be json or csv")
	}
	events, next, err := a.store.ListAudit(c.Request.Context(), f)
	if err != nil {
		return err
	}
	redact := redactFor(c)
	for i := range events {
		events[i] = redact(events[i])
	}
	c.JSON(http.StatusOK, gin.H{"events": events, "next_cursor": nextCursor(next)})
	return nil
}

func (a *API) verifyAudit(c *gin.Context) error {
	res, err := a.store.VerifyAudit(c.Request.Context())
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, res)
	return nil
}

func isNotFound(err error) bool { return errors.Is(err, rules.ErrNotFound) }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
