package api

import (
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/backend/store"
)

type changeCreateRequest struct {
	Domain      string `json:"domain"`
	YAML        string `json:"yaml"`
	Delete      bool   `json:"delete"`
	BaseVersion int64  `json:"base_version"`
	Message     string `json:"message"`
}

// createChange proposes a domain publish (or deletion) for review, whether
// or not approval is required.
func (a *API) createChange(c *gin.Context) {
	var req changeCreateRequest
	if err := decode(c, &req); err != nil {
		a.fail(c, err)
		return
	}
	if !domainName.MatchString(req.Domain) {
		a.fail(c, badRequest("domain names use letters, digits, '_', '.', '-' (at most 128)"))
		return
	}
	msg, err := checkMessage(req.Message)
	if err != nil {
		a.fail(c, err)
		return
	}
	ch := store.Change{Kind: store.KindPublish, Domain: req.Domain, YAML: req.YAML, BaseVersion: req.BaseVersion,
		Message: msg, Actor: a.actor(c)}
	if req.Delete {
		if req.YAML != "" {
			a.fail(c, badRequest("a deletion takes no yaml"))
			return
		}
		ch.Kind = store.KindDelete
	} else if err := validateDomain(req.Domain, req.YAML); err != nil {
		a.fail(c, err)
		return
	}
	cr, err := a.store.Propose(c.Request.Context(), ch)
	if err != nil {
		a.fail(c, err)
		return
	}
	c.JSON(http.StatusCreated, cr)
}

func (a *API) listChanges(c *gin.Context) {
	cursor, limit, err := page(c)
	if err != nil {
		a.fail(c, err)
		return
	}
	f := store.ChangeFilter{Status: c.Query("status"), Domain: c.Query("domain"), Author: c.Query("author"), Before: cursor, Limit: limit}
	switch f.Status {
	case "", store.ChangePending, store.ChangeApproved, store.ChangeRejected:
	default:
		a.fail(c, badRequest("status must be pending, approved or rejected"))
		return
	}
	crs, next, err := a.store.ListChanges(c.Request.Context(), f)
	if err != nil {
		a.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"changes": crs, "next_cursor": nextCursor(next)})
}

// changeView is a change request with, while it is pending, the difference
// it would make to the current ruleset.
type changeView struct {
	store.ChangeRequest
	Diff []domainDiffJSON `json:"diff,omitempty"`
}

func (a *API) getChange(c *gin.Context) {
	id, err := pathInt(c, "id")
	if err != nil {
		a.fail(c, err)
		return
	}
	cr, err := a.store.FindChange(c.Request.Context(), id)
	if err != nil {
		a.fail(c, err)
		return
	}
	view := changeView{ChangeRequest: cr}
	if cr.Status == store.ChangePending {
		if view.Diff, err = a.pendingDiff(c, cr); err != nil {
			a.fail(c, err)
			return
		}
	}
	c.JSON(http.StatusOK, view)
}

// pendingDiff compares the current ruleset with the one cr would publish.
func (a *API) pendingDiff(c *gin.Context, cr store.ChangeRequest) ([]domainDiffJSON, error) {
	cur, err := a.store.FindSnapshot(c.Request.Context(), 0)
	if err != nil {
		return nil, err
	}
	if cr.Kind == store.KindRollback {
		target, err := a.store.FindSnapshot(c.Request.Context(), *cr.RollbackOf)
		if err != nil {
			return nil, err
		}
		return diffDomains(cur.Domains, target.Domains), nil
	}
	var proposed []store.DomainRevision
	for _, d := range cur.Domains {
		if d.Name != cr.Domain {
			proposed = append(proposed, d)
		}
	}
	if !cr.Deleted {
		proposed = append(proposed, store.DomainRevision{Name: cr.Domain, YAML: cr.YAML})
	}
	return diffDomains(cur.Domains, proposed), nil
}

type reviewRequest struct {
	Message string `json:"message"`
}

// approveChange publishes a pending change request; the approver must not
// be its author.
func (a *API) approveChange(c *gin.Context) {
	id, err := pathInt(c, "id")
	if err != nil {
		a.fail(c, err)
		return
	}
	var req reviewRequest
	if err := decodeOptional(c, &req); err != nil {
		a.fail(c, err)
		return
	}
	msg := strings.TrimSpace(req.Message)
	if len(msg) > maxTextBytes {
		a.fail(c, badRequest("the message is over %d bytes", maxTextBytes))
		return
	}
	cr, err := a.store.FindChange(c.Request.Context(), id)
	if err != nil {
		a.fail(c, err)
		return
	}
	// The YAML was valid when proposed; check again in case this binary's
	// rules are stricter than the one that accepted it.
	if cr.Kind == store.KindPublish {
		if err := validateDomain(cr.Domain, cr.YAML); err != nil {
			a.fail(c, err)
			return
		}
	}
	if cr, err = a.store.Approve(c.Request.Context(), id, a.actor(c), msg); err != nil {
		a.fail(c, err)
		return
	}
	a.notify(c)
	c.JSON(http.StatusOK, cr)
}

// rejectChange closes a pending change request without publishing it; its
// author may reject it too, to withdraw it. A reason is required.
func (a *API) rejectChange(c *gin.Context) {
	id, err := pathInt(c, "id")
	if err != nil {
		a.fail(c, err)
		return
	}
	var req reviewRequest
	if err := decode(c, &req); err != nil {
		a.fail(c, err)
		return
	}
	msg, err := checkMessage(req.Message)
	if err != nil {
		a.fail(c, err)
		return
	}
	cr, err := a.store.Reject(c.Request.Context(), id, a.actor(c), msg)
	if err != nil {
		a.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, cr)
}
