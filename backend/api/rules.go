package api

import (
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules"
)

var domainName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,128}$`)

func domainParam(c *gin.Context) (string, error) {
	d := c.Param("domain")
	if !domainName.MatchString(d) {
		return "", httpError(http.StatusBadRequest, "bad_request", "domain names use letters, digits, '_', '.', '-' (at most 128)")
	}
	return d, nil
}

func (a *API) getRuleset(c *gin.Context) {
	snap, err := a.store.FindSnapshot(c, 0)
	if err != nil {
		a.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, snap)
}

func (a *API) getDomain(c *gin.Context) {
	name, err := domainParam(c)
	if err != nil {
		a.fail(c, err)
		return
	}
	d, err := a.store.FindDomain(c, name)
	if err != nil {
		a.fail(c, err)
		return
	}
	current, err := a.store.CurrentVersion(c)
	if err != nil {
		a.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"name": d.Name, "yaml": d.YAML, "version": d.Version, "current_version": current})
}

type publishRequest struct {
	YAML        string `json:"yaml"`
	Message     string `json:"message"`
	BaseVersion int64  `json:"base_version"`
}

func checkMessage(m string) (string, error) {
	m = strings.TrimSpace(m)
	if m == "" {
		return "", httpError(http.StatusBadRequest, "bad_request", "a change message is required")
	}
	if len(m) > 4096 {
		return "", httpError(http.StatusBadRequest, "bad_request", "the change message is over 4096 bytes")
	}
	return m, nil
}

// putDomain validates a domain's YAML and publishes it as a new version.
func (a *API) putDomain(c *gin.Context) {
	name, err := domainParam(c)
	if err != nil {
		a.fail(c, err)
		return
	}
	var req publishRequest
	if err := decode(c, &req); err != nil {
		a.fail(c, err)
		return
	}
	msg, err := checkMessage(req.Message)
	if err != nil {
		a.fail(c, err)
		return
	}
	if err := validateDomain(name, req.YAML); err != nil {
		a.fail(c, err)
		return
	}
	v, err := a.store.Publish(c, store.Change{Domain: name, YAML: req.YAML, BaseVersion: req.BaseVersion, Message: msg, Actor: a.actor(c)})
	if err != nil {
		a.fail(c, err)
		return
	}
	a.notify(c)
	c.JSON(http.StatusOK, gin.H{"version": v})
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
	if _, err := rules.Compile([]*rules.Domain{d}); err != nil {
		return err
	}
	return nil
}

type deleteRequest struct {
	Message     string `json:"message"`
	BaseVersion int64  `json:"base_version"`
}

func (a *API) deleteDomain(c *gin.Context) {
	name, err := domainParam(c)
	if err != nil {
		a.fail(c, err)
		return
	}
	var req deleteRequest
	if err := decode(c, &req); err != nil {
		a.fail(c, err)
		return
	}
	msg, err := checkMessage(req.Message)
	if err != nil {
		a.fail(c, err)
		return
	}
	v, err := a.store.Publish(c, store.Change{Domain: name, Delete: true, BaseVersion: req.BaseVersion, Message: msg, Actor: a.actor(c)})
	if err != nil {
		a.fail(c, err)
		return
	}
	a.notify(c)
	c.JSON(http.StatusOK, gin.H{"version": v})
}

// notify pushes the new version to this console's nodes. The publish has
// committed already, so a failure here is logged, not returned: nodes also
// catch up when they reconnect.
func (a *API) notify(c *gin.Context) {
	if err := a.hub.Notify(c); err != nil {
		a.log.WarnContext(c, "push new version", "error", err)
	}
}

func (a *API) listVersions(c *gin.Context) {
	before, err := queryInt(c, "before")
	if err != nil {
		a.fail(c, err)
		return
	}
	limit, err := queryInt(c, "limit")
	if err != nil {
		a.fail(c, err)
		return
	}
	vs, err := a.store.ListVersions(c, store.VersionFilter{Before: before, Limit: int(limit)})
	if err != nil {
		a.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"versions": a.withApplied(c, vs...)})
}

func (a *API) getVersion(c *gin.Context) {
	n, err := pathInt(c, "n")
	if err != nil {
		a.fail(c, err)
		return
	}
	meta, err := a.store.FindVersion(c, n)
	if err != nil {
		a.fail(c, err)
		return
	}
	snap, err := a.store.FindSnapshot(c, n)
	if err != nil {
		a.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"version": a.withApplied(c, meta)[0], "domains": snap.Domains})
}

type rollbackRequest struct {
	Message string `json:"message"`
}

func (a *API) rollback(c *gin.Context) {
	n, err := pathInt(c, "n")
	if err != nil {
		a.fail(c, err)
		return
	}
	var req rollbackRequest
	if err := decode(c, &req); err != nil {
		a.fail(c, err)
		return
	}
	msg, err := checkMessage(req.Message)
	if err != nil {
		a.fail(c, err)
		return
	}
	v, err := a.store.Rollback(c, n, msg, a.actor(c))
	if err != nil {
		a.fail(c, err)
		return
	}
	a.notify(c)
	c.JSON(http.StatusOK, gin.H{"version": v, "rollback_of": n})
}

func (a *API) listAudit(c *gin.Context) {
	before, err := queryInt(c, "before")
	if err != nil {
		a.fail(c, err)
		return
	}
	limit, err := queryInt(c, "limit")
	if err != nil {
		a.fail(c, err)
		return
	}
	f := store.AuditFilter{Actor: c.Query("actor"), Action: c.Query("action"), Target: c.Query("target"), Before: before, Limit: int(limit)}
	for name, dst := range map[string]*time.Time{"since": &f.Since, "until": &f.Until} {
		if s := c.Query(name); s != "" {
			t, err := time.Parse(time.RFC3339, s)
			if err != nil {
				a.fail(c, httpError(http.StatusBadRequest, "bad_request", "query parameter "+name+" must be an RFC 3339 time"))
				return
			}
			*dst = t
		}
	}
	events, err := a.store.ListAudit(c, f)
	if err != nil {
		a.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"events": events})
}

func (a *API) verifyAudit(c *gin.Context) {
	res, err := a.store.VerifyAudit(c)
	if err != nil {
		a.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, res)
}

func isNotFound(err error) bool { return errors.Is(err, rules.ErrNotFound) }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
