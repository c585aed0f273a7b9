package api

import (
	"errors"
	"slices"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules"
)

// rulesetRequest sets several domains and removes some in one version
// (sluice ctl rules apply and import). BaseVersion is the ruleset version
// the author saw: 409 if a domain it touches changed after it.
type rulesetRequest struct {
	Domains          map[string]string `json:"domains"` // name → YAML
	Delete           []string          `json:"delete"`
	Message          string            `json:"message"`
	BaseVersion      int64             `json:"base_version"`
	BreakGlassReason string            `json:"break_glass_reason"`
}

// putRuleset validates every domain of the request, then publishes all of
// them and the deletions as one version (or proposes them as one change
// request when approval is required). One invalid domain refuses the whole
// request with a 422 listing every problem of every domain, each naming its
// file as DOMAIN.yaml.
func (a *API) putRuleset(c *gin.Context) error {
	var req rulesetRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	msg, err := checkMessage(req.Message)
	if err != nil {
		return err
	}
	switch n := len(req.Domains) + len(req.Delete); {
	case n == 0:
		return badRequest("nothing to change: give domains to set or delete")
	case n > store.MaxEdits:
		return badRequest("a ruleset change touches at most %d domains, not %d", store.MaxEdits, n)
	}
	names := make([]string, 0, len(req.Domains))
	for name := range req.Domains {
		names = append(names, name)
	}
	slices.Sort(names)
	edits := make([]store.DomainEdit, 0, len(names)+len(req.Delete))
	var problems []rules.Problem
	for _, name := range names {
		if !domainName.MatchString(name) {
			return badRequest("domains: %q: domain names use letters, digits, '_', '.', '-' (at most 128)", name)
		}
		if err := validateDomain(name, req.Domains[name]); err != nil {
			var ve *rules.ValidationError
			if !errors.As(err, &ve) {
				return err
			}
			problems = append(problems, ve.Problems...)
			continue
		}
		edits = append(edits, store.DomainEdit{Domain: name, YAML: req.Domains[name]})
	}
	for _, name := range req.Delete {
		if !domainName.MatchString(name) {
			return badRequest("delete: %q: domain names use letters, digits, '_', '.', '-' (at most 128)", name)
		}
		if _, set := req.Domains[name]; set {
			return badRequest("domain %q is both in domains and in delete", name)
		}
		edits = append(edits, store.DomainEdit{Domain: name, Deleted: true})
	}
	if len(problems) > 0 {
		return &rules.ValidationError{Problems: problems}
	}
	return a.submit(c, store.Change{Kind: store.KindRuleset, Edits: edits, BaseVersion: req.BaseVersion, Message: msg,
		BreakGlass: req.BreakGlassReason})
}

// changeEdits are the domains a change request sets or removes: its edits
// for a ruleset change, else its one domain. Not for whole-ruleset rollbacks.
func changeEdits(cr store.ChangeRequest) []store.DomainEdit {
	if cr.Kind == store.KindRuleset {
		return cr.Edits
	}
	return []store.DomainEdit{{Domain: cr.Domain, YAML: cr.YAML, Deleted: cr.Deleted || cr.Kind == store.KindDelete}}
}

// validateEdits validates again what a change request would publish.
func validateEdits(cr store.ChangeRequest) error {
	var problems []rules.Problem
	for _, e := range changeEdits(cr) {
		if e.Deleted {
			continue
		}
		if err := validateDomain(e.Domain, e.YAML); err != nil {
			var ve *rules.ValidationError
			if !errors.As(err, &ve) {
				return err
			}
			problems = append(problems, ve.Problems...)
		}
	}
	if len(problems) > 0 {
		return &rules.ValidationError{Problems: problems}
	}
	return nil
}
