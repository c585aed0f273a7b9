package api

import (
	"cmp"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/backend/hub"
	"github.com/sluicehq/sluice/backend/store"
)

// listNodes serves the node registry: every enforcer the console knows,
// with the version it runs, the version it rejected and why, when it was
// last seen and its live decision rates. ?status=connected or
// ?status=disconnected filters.
func (a *API) listNodes(c *gin.Context) error {
	status := c.Query("status")
	if status != "" && status != store.NodeConnected && status != store.NodeDisconnected {
		return httpError(http.StatusBadRequest, "bad_request", "status must be connected or disconnected")
	}
	// The request's context, not gin's: a pooled gin.Context must not
	// outlive the handler inside database/sql.
	ctx := c.Request.Context()
	nodes, err := a.hub.Nodes(ctx)
	if err != nil {
		return err
	}
	current, err := a.store.CurrentVersion(ctx)
	if err != nil {
		return err
	}
	out := make([]store.Node, 0, len(nodes))
	for _, n := range nodes {
		if status == "" || n.Status == status {
			if n.Labels == nil {
				n.Labels = map[string]string{} // no labels: an empty set, never null
			}
			if n.UnsupportedDomains == nil {
				n.UnsupportedDomains = []store.UnsupportedDomain{}
			}
			n.Kind = cmp.Or(n.Kind, store.NodeSluice)
			out = append(out, n)
		}
	}
	ps, err := a.store.FindPushState(ctx)
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, gin.H{"nodes": out, "current_version": current, "rollout": ps.Staged})
	return nil
}

// nodeStream is the enforcers' subscription websocket; the node token was
// checked before the upgrade, and the hub binds it to the hello's node id.
func (a *API) nodeStream(c *gin.Context) {
	p := caller(c)
	a.hub.Serve(c.Writer, c.Request, p.tokenID, p.secret, a.actor(c))
}

// versionView is a version with how many of the connected nodes run it.
// AppliedBy and Connected are null when they could not be counted. Rollout
// is set when the version was staged (null: it went to every node).
type versionView struct {
	store.Version
	AppliedBy *int           `json:"applied_by"`
	Connected *int           `json:"connected"`
	Rollout   *store.Rollout `json:"rollout"`
}

// withApplied adds to each version how many connected nodes run it. The
// counts are secondary: if they cannot be read, the versions are returned
// without them and the error is logged.
func (a *API) withApplied(c *gin.Context, vs ...store.Version) []versionView {
	out := make([]versionView, len(vs))
	counts, err := a.store.AppliedCounts(c.Request.Context(), time.Now().Add(-hub.StaleAfter))
	if err != nil {
		a.log.WarnContext(c, "count nodes by version", "error", err)
	}
	ids := make([]int64, len(vs))
	for i, v := range vs {
		ids[i] = v.Version
	}
	rollouts, rerr := a.store.FindRollouts(c.Request.Context(), ids...)
	if rerr != nil {
		a.log.WarnContext(c, "read rollouts", "error", rerr)
	}
	for i, v := range vs {
		out[i].Version = v
		if r, ok := rollouts[v.Version]; ok {
			out[i].Rollout = &r
		}
		if err == nil {
			applied, connected := counts.ByVersion[v.Version], counts.Connected
			out[i].AppliedBy, out[i].Connected = &applied, &connected
		}
	}
	return out
}
