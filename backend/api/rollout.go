package api

import (
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/backend/stats"
	"github.com/sluicehq/sluice/backend/store"
)

// checkRollout refuses a publish's rollout that names no label, a bad
// label or a bad automatic halt, with a 400 naming the field.
func checkRollout(r *store.RolloutSpec) error {
	if r == nil {
		return nil
	}
	if err := r.Check(); err != nil {
		return badRequest("%s", err.Error())
	}
	return nil
}

type promoteRequest struct {
	Message string `json:"message"`
}

// promote sends staged version n to every node: 200 {"version": n}; 404 for
// an unknown version, 409 when n is not staged (never staged, promoted
// already or rolled back).
func (a *API) promote(c *gin.Context) error {
	n, err := pathInt(c, "n")
	if err != nil {
		return err
	}
	var req promoteRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	msg, err := checkMessage(req.Message)
	if err != nil {
		return err
	}
	// Promoting sends n's changes to every node: the caller must hold
	// every domain n changed.
	v, err := a.store.FindVersion(c.Request.Context(), n)
	if err != nil {
		return err
	}
	if err := a.requireDomains(c, v.Domains...); err != nil {
		return err
	}
	if err := a.store.Promote(c.Request.Context(), n, msg, a.actor(c)); err != nil {
		return err
	}
	a.notify(c)
	c.JSON(http.StatusOK, gin.H{"version": n})
	return nil
}

// versionCohorts serves a staged version's canary against the other nodes,
// second by second over the live window since it was staged (until its
// rollout ended): {"rollout", "domains", "step_s", "points"}. A version that
// was never staged has no cohorts: 404.
func (a *API) versionCohorts(c *gin.Context) error {
	n, err := pathInt(c, "n")
	if err != nil {
		return err
	}
	ctx := c.Request.Context()
	v, err := a.store.FindVersion(ctx, n)
	if err != nil {
		return err
	}
	rs, err := a.store.FindRollouts(ctx, n)
	if err != nil {
		return err
	}
	r, ok := rs[n]
	if !ok {
		return httpError(http.StatusNotFound, "not_found", "version "+itoa(n)+" was not staged: it went to every node when it was published")
	}
	from, to := r.CreatedAt.Unix(), time.Now().Unix()
	if r.EndedAt != nil {
		to = r.EndedAt.Unix()
	}
	points := []stats.CohortPoint{}
	if a.stats != nil {
		points = a.stats.Cohorts(v.Domains, from, to)
	}
	c.JSON(http.StatusOK, gin.H{"rollout": r, "domains": v.Domains, "step_s": 1, "from": from, "to": to, "points": points})
	return nil
}
