package api

import (
	"net/http"
	"slices"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/backend/store"
)

// requireDomains refuses, with a 403 saying why, a write to any of domains
// that the caller's role does not hold: a user or token granted some
// domains only ("domains" on users and tokens) reads every domain but
// writes its own. Every handler that writes to a domain calls it, after
// the route's role check, with every domain the write touches; a write
// that touches one domain outside the scope is refused whole. The details
// list the domains refused.
func (a *API) requireDomains(c *gin.Context, domains ...string) error {
	p := caller(c)
	if p == nil {
		return httpError(http.StatusUnauthorized, "unauthorized", "sign in or send a Bearer token")
	}
	if p.scope.All {
		return nil
	}
	var out []string
	for _, d := range domains {
		if !p.scope.Allows(d) && !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		return nil
	}
	slices.Sort(out)
	e := httpError(http.StatusForbidden, "domain_forbidden",
		"your role ("+p.role+") holds for "+p.scope.String()+" only; this change touches "+strings.Join(out, ", "))
	e.details = gin.H{"domains": out, "allowed": scopeDomains(p.scope)}
	return e
}

// scopeDomains is a scope's list for JSON: [] for every domain.
func scopeDomains(s store.Scope) []string {
	if s.All || s.Domains == nil {
		return []string{}
	}
	return s.Domains
}

// touchedDomains returns every domain ch would change: for a whole-version
// rollback, the domains whose content differs between the latest version
// and the one rolled back to.
func (a *API) touchedDomains(c *gin.Context, ch store.Change) ([]string, error) {
	switch ch.Kind {
	case store.KindRuleset:
		out := make([]string, len(ch.Edits))
		for i, e := range ch.Edits {
			out[i] = e.Domain
		}
		return out, nil
	case store.KindRollback:
		return a.changedBetween(c, 0, ch.RollbackTo)
	}
	return []string{ch.Domain}, nil
}

// changedBetween returns the domains whose YAML differs between versions
// from (0: the latest) and to, or that only one of them has.
func (a *API) changedBetween(c *gin.Context, from, to int64) ([]string, error) {
	older, err := a.store.FindSnapshot(c.Request.Context(), to)
	if err != nil {
		return nil, err
	}
	newer, err := a.store.FindSnapshot(c.Request.Context(), from)
	if err != nil {
		return nil, err
	}
	yaml := make(map[string]string, len(older.Domains))
	for _, d := range older.Domains {
		yaml[d.Name] = d.YAML
	}
	var out []string
	for _, d := range newer.Domains {
		if y, ok := yaml[d.Name]; !ok || y != d.YAML {
			out = append(out, d.Name)
		}
		delete(yaml, d.Name)
	}
	for name := range yaml {
		out = append(out, name)
	}
	return out, nil
}

// requireChange is requireDomains for every domain a change touches; the
// check costs nothing for a caller who holds every domain.
func (a *API) requireChange(c *gin.Context, ch store.Change) error {
	if p := caller(c); p != nil && p.scope.All {
		return nil
	}
	domains, err := a.touchedDomains(c, ch)
	if err != nil {
		return err
	}
	return a.requireDomains(c, domains...)
}

// proposed is the change a change request would publish, as far as the
// domains it touches go.
func proposed(cr store.ChangeRequest) store.Change {
	ch := store.Change{Kind: cr.Kind, Domain: cr.Domain, Edits: cr.Edits}
	if cr.RollbackOf != nil {
		ch.RollbackTo = *cr.RollbackOf
	}
	return ch
}
