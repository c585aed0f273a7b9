package api

import (
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules"
)

// diffJSON is the difference between two rulesets, per domain.
type diffJSON struct {
	From    int64              `json:"from"`
	To      int64              `json:"to"`
	Domains []rules.DomainDiff `json:"domains"` // only domains that differ, by name
}

func (a *API) snapshot(c *gin.Context, v int64) ([]store.DomainRevision, error) {
	if v == 0 {
		return nil, nil // FindSnapshot(0) is the latest; 0 here is "nothing yet"
	}
	s, err := a.store.FindSnapshot(c.Request.Context(), v)
	return s.Domains, err
}

// diffVersions answers GET /versions/{a}/diff/{b}: what changed from a to b.
func (a *API) diffVersions(c *gin.Context) error {
	from, err := pathVersion(c, "n")
	if err != nil {
		return err
	}
	to, err := pathVersion(c, "m")
	if err != nil {
		return err
	}
	old, err := a.snapshot(c, from)
	if err != nil {
		return err
	}
	cur, err := a.snapshot(c, to)
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, diffJSON{From: from, To: to, Domains: diffDomains(old, cur)})
	return nil
}

// diffDomains compares two rulesets domain by domain (see rules.DiffRulesets).
func diffDomains(old, cur []store.DomainRevision) []rules.DomainDiff {
	return rules.DiffRulesets(yamlByName(old), yamlByName(cur))
}

func yamlByName(ds []store.DomainRevision) map[string]string {
	m := make(map[string]string, len(ds))
	for _, d := range ds {
		m[d.Name] = d.Enforced() // what nodes enforce: overrides included
	}
	return m
}
