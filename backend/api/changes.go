package api

import (
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules"
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
func (a *API) createChange(c *gin.Context) error {
	var req changeCreateRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if !domainName.MatchString(req.Domain) {
		return badRequest("domain names use letters, digits, '_', '.', '-' (at most 128)")
	}
	msg, err := checkMessage(req.Message)
	if err != nil {
		return err
	}
	if err := a.requireDomains(c, req.Domain); err != nil {
		return err
	}
	ch := store.Change{Kind: store.KindPublish, Domain: req.Domain, YAML: req.YAML, BaseVersion: req.BaseVersion,
		Message: msg, Actor: a.actor(c)}
	if req.Delete {
		if req.YAML != "" {
			return badRequest("a deletion takes no yaml")
		}
		ch.Kind = store.KindDelete
	} else if err := validateDomain(req.Domain, req.YAML); err != nil {
		return err
	}
	cr, err := a.store.Propose(c.Request.Context(), ch)
	if err != nil {
		return err
	}
	c.JSON(http.StatusCreated, cr)
	return nil
}

func (a *API) listChanges(c *gin.Context) error {
	cursor, limit, err := page(c)
	if err != nil {
		return err
	}
	f := store.ChangeFilter{Status: c.Query("status"), Domain: c.Query("domain"), Author: c.Query("author"), Before: cursor, Limit: limit}
	switch f.Status {
	case "", store.ChangePending, store.ChangeApproved, store.ChangeRejected:
	default:
		return badRequest("status must be pending, approved or rejected")
	}
	crs, next, err := a.store.ListChanges(c.Request.Context(), f)
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, gin.H{"changes": crs, "next_cursor": nextCursor(next)})
	return nil
}

// changeView is a change request with, while it is pending, the difference
// it would make to the current ruleset.
type changeView struct {
	store.ChangeRequest
	Diff []rules.DomainDiff `json:"diff,omitempty"`
}

func (a *API) getChange(c *gin.Context) error {
	id, err := pathInt(c, "id")
	if err != nil {
		return err
	}
	cr, err := a.store.FindChange(c.Request.Context(), id)
	if err != nil {
		return err
	}
	view := changeView{ChangeRequest: cr}
	if cr.Status == store.ChangePending {
		if view.Diff, err = a.pendingDiff(c, cr); err != nil {
			return err
		}
	}
	c.JSON(http.StatusOK, view)
	return nil
}

// pendingDiff compares the current ruleset with the one cr would publish.
func (a *API) pendingDiff(c *gin.Context, cr store.ChangeRequest) ([]rules.DomainDiff, error) {
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
	if cr.Kind == store.KindOverride && cr.Override != nil {
		o := cr.Override
		proposed := make([]store.DomainRevision, len(cur.Domains))
		for i, d := range cur.Domains {
			if d.Name == o.Domain {
				d = d.WithOverride(store.ActiveOverride{Entries: o.Entries, RateLimit: o.RateLimit, ExpiresAt: o.ExpiresAt})
			}
			proposed[i] = d
		}
		return diffDomains(cur.Domains, proposed), nil
	}
	edits := changeEdits(cr)
	touched := make(map[string]bool, len(edits))
	for _, e := range edits {
		touched[e.Domain] = true
	}
	var proposed []store.DomainRevision
	current := make(map[string]store.DomainRevision, len(cur.Domains))
	for _, d := range cur.Domains {
		current[d.Name] = d
		if !touched[d.Name] {
			proposed = append(proposed, d)
		}
	}
	for _, e := range edits {
		if !e.Deleted {
			// The domain's overrides stay over its new YAML.
			proposed = append(proposed, current[e.Domain].WithYAML(e.Domain, e.YAML))
		}
	}
	return diffDomains(cur.Domains, proposed), nil
}

type reviewRequest struct {
	Message string `json:"message"`
}

// pathAndMessage reads the path's id and a body whose required message is
// why: rejecting a change, ending an override.
func pathAndMessage(c *gin.Context) (int64, string, error) {
	id, err := pathInt(c, "id")
	if err != nil {
		return 0, "", err
	}
	var req reviewRequest
	if err := decode(c, &req); err != nil {
		return 0, "", err
	}
	msg, err := checkMessage(req.Message)
	if err != nil {
		return 0, "", err
	}
	return id, msg, nil
}

// approveChange publishes a pending change request; the approver must not
// be its author.
func (a *API) approveChange(c *gin.Context) error {
	id, err := pathInt(c, "id")
	if err != nil {
		return err
	}
	var req reviewRequest
	if err := decodeOptional(c, &req); err != nil {
		return err
	}
	msg, err := freeText("message", req.Message, false)
	if err != nil {
		return err
	}
	cr, err := a.store.FindChange(c.Request.Context(), id)
	if err != nil {
		return err
	}
	// The approver holds editor on every domain the change touches.
	if err := a.requireChange(c, proposed(cr)); err != nil {
		return err
	}
	// The YAML was valid when proposed; check again in case this binary's
	// rules are stricter than the one that accepted it.
	if cr.Kind == store.KindPublish || cr.Kind == store.KindRuleset {
		if err := validateEdits(cr); err != nil {
			return err
		}
	}
	if cr, err = a.store.Approve(c.Request.Context(), id, a.actor(c), msg); err != nil {
		return err
	}
	a.notify(c)
	c.JSON(http.StatusOK, cr)
	return nil
}

// rejectChange closes a pending change request without publishing it; its
// author may reject it too, to withdraw it. A reason is required.
func (a *API) rejectChange(c *gin.Context) error {
	id, msg, err := pathAndMessage(c)
	if err != nil {
		return err
	}
	cr, err := a.store.FindChange(c.Request.Context(), id)
	if err != nil {
		return err
	}
	if err := a.requireChange(c, proposed(cr)); err != nil {
		return err
	}
	cr, err = a.store.Reject(c.Request.Context(), id, a.actor(c), msg)
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, cr)
	return nil
}
