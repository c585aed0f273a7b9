package api

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/backend/stats"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/wire"
)

// previewRequest is a draft of one domain.
type previewRequest struct {
	Domain string `json:"domain"`
	YAML   string `json:"yaml"`
}

// previewPoint is one span of a previewed limit: what the rule decided
// (requests) and actually limited then, and what the draft limit would
// have limited, with bounds, and of how many distinct values.
type previewPoint struct {
	T              int64 `json:"t"`
	SpanS          int64 `json:"span_s"`
	Requests       int64 `json:"requests"`
	Limited        int64 `json:"limited"`
	WouldLimit     int64 `json:"would_limit"`
	WouldLimitLow  int64 `json:"would_limit_low"`
	WouldLimitHigh int64 `json:"would_limit_high"`
	Values         int64 `json:"values"`
	ValuesLow      int64 `json:"values_low"`
	ValuesHigh     int64 `json:"values_high"`
}

// previewTotals sums a limit's points; ValuesMax is the most distinct
// values of one span (the hour's distinct values are at least that and at
// most the sum over the spans).
type previewTotals struct {
	Requests       int64 `json:"requests"`
	Limited        int64 `json:"limited"`
	WouldLimit     int64 `json:"would_limit"`
	WouldLimitLow  int64 `json:"would_limit_low"`
	WouldLimitHigh int64 `json:"would_limit_high"`
	ValuesMax      int64 `json:"values_max"`
}

// previewLimit is the preview of one changed or new limit.
type previewLimit struct {
	Name   string     `json:"name"`
	Change string     `json:"change"` // limit_added or limit_changed
	Before *limitJSON `json:"before"`
	After  limitJSON  `json:"after"`
	// Rule is the stats rule whose traffic is replayed (the old name of a
	// renamed limit).
	Rule string `json:"rule,omitempty"`
	// Previewable is false when the traffic cannot answer; Reason says why.
	Previewable bool   `json:"previewable"`
	Reason      string `json:"reason,omitempty"`
	// Estimate is true when replaying counts only approximates the
	// algorithm (token and leaky buckets); EstimateReason says how.
	Estimate       bool   `json:"estimate"`
	EstimateReason string `json:"estimate_reason,omitempty"`
	// Error states the bounds' meaning for this limit.
	Error  string         `json:"error,omitempty"`
	Points []previewPoint `json:"points"`
	Totals previewTotals  `json:"totals"`
}

const (
	previewError = "would_limit and values lie within [low, high] for the traffic the nodes recorded: exact for " +
		"per-value counts below 32, within 1/16 above; requests of values beyond a node's per-rule bound widen high. " +
		"A value whose traffic is spread over several nodes in one window is counted per node, so a lowered limit's " +
		"would_limit is then a lower bound."
	slidingNote = " Sliding windows are replayed in whole windows of the node's clock; traffic that crosses " +
		"window edges is limited more by a sliding window than the replay shows."
	bucketReason = "token and leaky buckets refill continuously and carry up to their burst across windows: " +
		"replaying per-window counts against requests_per_unit per unit is only an estimate."
)

// Bounds of a preview. Its cost grows with the draft (parsed, diffed
// against the published domain, every changed limit replayed and sent
// back: a 1 MB draft took over half a second and answered 7 MB), so a
// preview takes a quarter of what a publish takes, and previews at most
// maxPreviewLimits changed or new limits.
const (
	maxPreviewYAMLBytes = rules.MaxSourceBytes / 4
	maxPreviewLimits    = 200
)

// preview replays the last hour of real traffic against each changed or
// new limit of a draft domain (POST /api/v1/preview). The draft goes
// through the publish's validation (same 422).
func (a *API) preview(c *gin.Context) error {
	var req previewRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if !domainName.MatchString(req.Domain) {
		return badRequest("domain names use letters, digits, '_', '.', '-' (at most 128)")
	}
	if len(req.YAML) > maxPreviewYAMLBytes {
		return httpError(http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf(
			"a preview takes at most %d bytes of YAML, not %d (a publish takes up to %d): preview a smaller draft",
			maxPreviewYAMLBytes, len(req.YAML), rules.MaxSourceBytes))
	}
	if err := validateDomain(req.Domain, req.YAML); err != nil {
		return err
	}
	draft, err := rules.Parse(req.Domain+".yaml", []byte(req.YAML))
	if err != nil {
		return err
	}
	ctx := c.Request.Context()
	var published []*rules.Domain
	switch d, err := a.store.FindDomain(ctx, req.Domain); {
	case err == nil:
		if old, err := rules.Parse(req.Domain+".yaml", []byte(d.YAML)); err == nil {
			published = []*rules.Domain{old}
		}
	case errors.Is(err, rules.ErrNotFound):
	default:
		return err
	}
	after := byLimitName(draft)
	before := map[string]limitJSON{}
	if len(published) > 0 {
		before = byLimitName(published[0])
	}

	var out []previewLimit
	var names []string
	for _, ch := range rules.Diff(published, []*rules.Domain{draft}) {
		if ch.Kind != rules.LimitAdded && ch.Kind != rules.LimitChanged {
			continue
		}
		l, ok := after[ch.Name]
		if !ok {
			continue
		}
		p := previewLimit{Name: ch.Name, Change: string(ch.Kind), After: l, Points: []previewPoint{}}
		if ch.Kind == rules.LimitChanged {
			p.Rule = ch.Name
			for _, f := range ch.Fields {
				if f.Field == "rate_limit.name" && f.Before != "" {
					p.Rule = f.Before
				}
			}
			if b, ok := before[p.Rule]; ok {
				p.Before = &b
			}
			names = append(names, p.Rule)
		}
		out = append(out, p)
	}
	if len(out) > maxPreviewLimits {
		return &apiError{status: http.StatusUnprocessableEntity, code: "too_many_limits",
			message: fmt.Sprintf("the draft changes or adds %d limits; a preview replays at most %d: preview fewer changes at a time", len(out), maxPreviewLimits),
			details: gin.H{"limits": len(out), "max_limits": maxPreviewLimits}}
	}
	spans := map[string][]wire.RulePreview{}
	if a.stats != nil && len(names) > 0 {
		if spans, err = a.stats.PreviewSpans(ctx, req.Domain, names); err != nil {
			return err
		}
	}
	for i := range out {
		replayLimit(&out[i], spans[out[i].Rule])
	}
	c.JSON(http.StatusOK, gin.H{"domain": req.Domain, "window_s": int64(stats.PreviewWindow / time.Second), "limits": orEmpty(out)})
	return nil
}

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// byLimitName returns d's limits by name.
func byLimitName(d *rules.Domain) map[string]limitJSON {
	m := map[string]limitJSON{}
	for _, l := range limitsOf(d) {
		m[l.Name] = l
	}
	return m
}

// replayLimit fills p's points from its rule's spans, or says why it
// cannot.
func replayLimit(p *previewLimit, spans []wire.RulePreview) {
	l := p.After
	switch {
	case p.Change == string(rules.LimitAdded):
		p.Reason = "a new limit: no rule counts this descriptor today, so there is no traffic to replay"
		return
	case len(spans) == 0:
		p.Reason = "no traffic recorded for rule " + p.Rule + " in the last hour"
		return
	}
	window := int64(0)
	if !l.Unlimited {
		window = int64(rules.Unit(l.Unit).Period() / time.Second)
	}
	switch l.Algorithm {
	case string(rules.TokenBucket), string(rules.LeakyBucket):
		p.Estimate, p.EstimateReason = true, bucketReason
	}
	p.Error = previewError
	if l.Algorithm == string(rules.SlidingWindowLog) || l.Algorithm == string(rules.SlidingWindowCounter) {
		p.Error += slidingNote
	}
	for _, s := range spans {
		pt := previewPoint{T: s.T, SpanS: s.SpanS, Requests: s.Requests, Limited: s.Limited}
		switch {
		case l.Unlimited:
		case l.RequestsPerUnit == 0: // blocks every request
			n, _ := s.Span.Entries()
			pt.WouldLimit, pt.WouldLimitLow, pt.WouldLimitHigh = s.Requests, s.Requests, s.Requests
			pt.Values, pt.ValuesLow, pt.ValuesHigh = n, n, n+s.Untracked
		default:
			r, ok := stats.Replay(s, int64(l.RequestsPerUnit), window)
			if !ok {
				p.Points = []previewPoint{}
				p.Reason = "the nodes record per-value counts per second and per " + spanName(s.SpanS) +
					"; a limit per " + l.Unit + " needs per-value counts over a whole " + l.Unit + ", which are not kept"
				p.Totals = previewTotals{}
				return
			}
			pt.WouldLimit, pt.WouldLimitLow, pt.WouldLimitHigh = r.Estimate, r.Low, r.High
			pt.Values, pt.ValuesLow, pt.ValuesHigh = r.Values, r.ValuesLow, r.ValuesHigh
		}
		p.Points = append(p.Points, pt)
		t := &p.Totals
		t.Requests += pt.Requests
		t.Limited += pt.Limited
		t.WouldLimit += pt.WouldLimit
		t.WouldLimitLow += pt.WouldLimitLow
		t.WouldLimitHigh += pt.WouldLimitHigh
		t.ValuesMax = max(t.ValuesMax, pt.Values)
	}
	p.Previewable = true
}

func spanName(s int64) string {
	if s == 60 {
		return "minute"
	}
	return time.Duration(s * int64(time.Second)).String()
}
