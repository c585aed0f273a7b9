package api

import (
	"net/http"
	"slices"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules"
)

// diffJSON is the difference between two rulesets, per domain.
type diffJSON struct {
	From    int64            `json:"from"`
	To      int64            `json:"to"`
	Domains []domainDiffJSON `json:"domains"` // only domains that differ, by name
}

type domainDiffJSON struct {
	Name    string         `json:"name"`
	Change  string         `json:"change"`  // added, removed or changed
	Unified string         `json:"unified"` // unified diff of the YAML
	Changes []rules.Change `json:"changes"` // structured: domain and limits added, removed or changed
	// Error is set when one side's YAML no longer parses, so Changes could
	// not be computed (Unified still shows the text).
	Error string `json:"error,omitempty"`
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

// diffDomains compares two rulesets domain by domain.
func diffDomains(old, cur []store.DomainRevision) []domainDiffJSON {
	before := make(map[string]string, len(old))
	for _, d := range old {
		before[d.Name] = d.YAML
	}
	after := make(map[string]string, len(cur))
	for _, d := range cur {
		after[d.Name] = d.YAML
	}
	var names []string
	for n := range before {
		names = append(names, n)
	}
	for n := range after {
		if _, ok := before[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	out := []domainDiffJSON{}
	for _, n := range names {
		a, inA := before[n]
		b, inB := after[n]
		if inA && inB && a == b {
			continue
		}
		d := domainDiffJSON{Name: n, Change: "changed", Unified: rules.UnifiedDiff(n+".yaml", a, b), Changes: []rules.Change{}}
		switch {
		case !inA:
			d.Change = "added"
		case !inB:
			d.Change = "removed"
		}
		var olds, news []*rules.Domain
		for _, side := range []struct {
			src     string
			present bool
			into    *[]*rules.Domain
		}{{a, inA, &olds}, {b, inB, &news}} {
			if !side.present {
				continue
			}
			dom, err := rules.Parse(n+".yaml", []byte(side.src))
			if err != nil {
				d.Error = "the rules no longer parse: " + err.Error()
				break
			}
			*side.into = append(*side.into, dom)
		}
		if d.Error == "" {
			if changes := rules.Diff(olds, news); changes != nil {
				d.Changes = changes
			}
		}
		out = append(out, d)
	}
	return out
}
