package api

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/backend/hub"
	"github.com/sluicehq/sluice/backend/stats"
	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules/wire"
)

// Bounds of the alert settings.
const (
	maxWebhooks      = 20
	maxWebhookURL    = 2048
	maxStatsDomains  = 1000
	maxSpikeFloor    = 1e9
	maxSpikeFactor   = 1000
	maxSpikeDuration = 3600
)

// masked reports whether the caller sees masked descriptor values: viewers
// do, for domains that mask them; support staff look customers up by their
// values, so they see them as editors do.
func masked(c *gin.Context) bool {
	p := caller(c)
	return p == nil || roleRank[p.role] < roleRank[store.RoleSupport]
}

// statsQuery reads domain, rule, from and to (and step for history).
// to defaults to now and from to an hour before to.
func statsQuery(c *gin.Context, history bool) (stats.Query, error) {
	q := stats.Query{Domain: c.Query("domain"), Rule: c.Query("rule")}
	var err error
	if q.From, err = queryTime(c, "from"); err != nil {
		return q, err
	}
	if q.To, err = queryTime(c, "to"); err != nil {
		return q, err
	}
	if q.To.IsZero() {
		q.To = time.Now()
	}
	if q.From.IsZero() {
		q.From = q.To.Add(-time.Hour)
	}
	if history {
		q.Step = 60
		if s := c.Query("step"); s != "" {
			if q.Step, err = strconv.ParseInt(s, 10, 64); err != nil {
				return q, badRequest("query parameter step must be a whole number of seconds")
			}
		}
	}
	if err := q.CheckRange(history); err != nil {
		return q, badRequest("%s", err.Error())
	}
	return q, nil
}

func (a *API) statsTotals(c *gin.Context) error {
	q, err := statsQuery(c, false)
	if err != nil {
		return err
	}
	rows, err := a.stats.Totals(c.Request.Context(), q)
	if err != nil {
		return err
	}
	type rule struct {
		Domain string `json:"domain"`
		Rule   string `json:"rule"`
		store.Counts
	}
	out := make([]rule, len(rows))
	for i, r := range rows {
		out[i] = rule{r.Domain, r.Rule, r.Counts}
	}
	c.JSON(http.StatusOK, gin.H{"rules": out, "from": q.From.UTC().Format(time.RFC3339), "to": q.To.UTC().Format(time.RFC3339)})
	return nil
}

func (a *API) statsLive(c *gin.Context) error {
	v, err := a.stats.Live(c.Request.Context(), c.Query("domain"), masked(c))
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, v)
	return nil
}

func (a *API) statsHistory(c *gin.Context) error {
	q, err := statsQuery(c, true)
	if err != nil {
		return err
	}
	v, err := a.stats.History(c.Request.Context(), q)
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, v)
	return nil
}

func (a *API) statsDomains(c *gin.Context) error {
	from, sparks := a.stats.Sparks()
	c.JSON(http.StatusOK, gin.H{"step_s": stats.SparkStep, "from": from, "domains": sparks})
	return nil
}

func (a *API) statsSettings(c *gin.Context) error {
	out := make(map[string]gin.H)
	for d := range a.stats.MaskedDomains() {
		out[d] = gin.H{"mask_values": true}
	}
	c.JSON(http.StatusOK, gin.H{"domains": out})
	return nil
}

func (a *API) statsStream(c *gin.Context) {
	sub := a.stats.Subscribe(c.Query("domain"), masked(c))
	hub.ServeStream(c.Request.Context(), c.Writer, c.Request, sub, a.stillValid(caller(c)))
}

// alertsView is GET /api/v1/alerts: the settings with their defaults and
// the latest deliveries.
type alertsView struct {
	store.AlertConfig
	Deliveries []store.Delivery `json:"deliveries"`
}

func (a *API) getAlerts(c *gin.Context) error {
	ds, err := a.store.ListDeliveries(c.Request.Context(), 50)
	if err != nil {
		return err
	}
	if ds == nil {
		ds = []store.Delivery{}
	}
	c.JSON(http.StatusOK, alertsView{AlertConfig: a.stats.Config(), Deliveries: ds})
	return nil
}

type alertsRequest struct {
	Webhooks      []store.Webhook                      `json:"webhooks"`
	SpikeDefaults store.SpikeSettings                  `json:"spike_defaults"`
	Domains       map[string]store.DomainStatsSettings `json:"domains"`
}

var alertEvents = []string{stats.EventSpikeStart, stats.EventSpikeEnd}

func (r *alertsRequest) check() error {
	if len(r.Webhooks) > maxWebhooks {
		return badRequest("at most %d webhooks", maxWebhooks)
	}
	for i, w := range r.Webhooks {
		u, err := url.Parse(w.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || len(w.URL) > maxWebhookURL {
			return badRequest("webhooks[%d].url must be an http or https URL of at most %d bytes", i, maxWebhookURL)
		}
		for _, e := range w.Events {
			if !slices.Contains(alertEvents, e) {
				return badRequest("webhooks[%d].events: %q is not one of spike.start, spike.end", i, wire.Cut(e, 40))
			}
		}
		if w.Events == nil {
			r.Webhooks[i].Events = []string{}
		}
	}
	if err := checkSpike("spike_defaults", r.SpikeDefaults.FloorPerS, r.SpikeDefaults.Factor, r.SpikeDefaults.ForS); err != nil {
		return err
	}
	if len(r.Domains) > maxStatsDomains {
		return badRequest("at most %d domains", maxStatsDomains)
	}
	for d, s := range r.Domains {
		if d == "" || len(d) > stats.MaxNameBytes {
			return badRequest("domains: a domain name must be 1 to %d bytes", stats.MaxNameBytes)
		}
		if err := checkText("domains", d); err != nil {
			return err
		}
		if err := checkSpike("domains."+wire.Cut(d, 40), s.FloorPerS, s.Factor, s.ForS); err != nil {
			return err
		}
	}
	return nil
}

func checkSpike(path string, floor, factor float64, forS int) error {
	switch {
	case floor < 0 || floor > maxSpikeFloor:
		return badRequest("%s.floor_per_s must be within 0..%g (0: the default)", path, float64(maxSpikeFloor))
	case factor != 0 && (factor < 1 || factor > maxSpikeFactor):
		return badRequest("%s.factor must be within 1..%d (0: the default)", path, maxSpikeFactor)
	case forS < 0 || forS > maxSpikeDuration:
		return badRequest("%s.for_s must be within 0..%d seconds (0: the default)", path, maxSpikeDuration)
	}
	return nil
}

func (a *API) putAlerts(c *gin.Context) error {
	var req alertsRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if err := req.check(); err != nil {
		return err
	}
	cfg, err := a.store.UpdateAlertConfig(c.Request.Context(), store.AlertConfig{
		Webhooks: req.Webhooks, SpikeDefaults: req.SpikeDefaults, Domains: req.Domains}, a.actor(c))
	if err != nil {
		return err
	}
	a.stats.SetConfig(cfg)
	return a.getAlerts(c)
}

func (a *API) testAlert(c *gin.Context) error {
	var req struct{}
	if err := decodeOptional(c, &req); err != nil {
		return err
	}
	n, err := a.stats.TestAlert(c.Request.Context())
	if err != nil {
		return err
	}
	if n == 0 {
		return httpError(http.StatusConflict, "no_webhooks", "no webhook is configured")
	}
	c.JSON(http.StatusAccepted, gin.H{"queued": n})
	return nil
}

// Bounds of the value lookups.
const (
	defaultRecentValues = 20
	maxRecentValues     = 100
)

// lookupParam reads a query parameter naming a domain or a value: at most
// stats.MaxNameBytes of UTF-8 without NUL, and present when required.
func lookupParam(c *gin.Context, name string, required bool) (string, error) {
	s := c.Query(name)
	switch {
	case s == "" && required:
		return "", badRequest("query parameter %s is required", name)
	case len(s) > stats.MaxNameBytes:
		return "", badRequest("query parameter %s is over %d bytes", name, stats.MaxNameBytes)
	}
	if err := checkText("query parameter "+name, s); err != nil {
		return "", err
	}
	return s, nil
}

// lookupDomain reads the domain of a value lookup, refused to a viewer when
// the domain masks its values: a masked value cannot be looked up.
func (a *API) lookupDomain(c *gin.Context) (string, error) {
	domain, err := lookupParam(c, "domain", true)
	if err != nil {
		return "", err
	}
	if _, m := a.maskValue(c, domain, ""); m {
		return "", badRequest("domain %q masks its values for viewers: a value cannot be looked up", domain)
	}
	return domain, nil
}

// statsValues answers GET /api/v1/stats/values: one value's limited
// requests per rule and minute, the last 24 hours by default.
func (a *API) statsValues(c *gin.Context) error {
	domain, err := a.lookupDomain(c)
	if err != nil {
		return err
	}
	value, err := lookupParam(c, "value", true)
	if err != nil {
		return err
	}
	from, err := queryTime(c, "from")
	if err != nil {
		return err
	}
	to, err := queryTime(c, "to")
	if err != nil {
		return err
	}
	if to.IsZero() {
		to = time.Now()
	}
	if from.IsZero() {
		from = to.Add(-24 * time.Hour)
	}
	switch {
	case !from.Before(to):
		return badRequest("from (%s) must be before to (%s)", from.UTC().Format(time.RFC3339), to.UTC().Format(time.RFC3339))
	case to.Sub(from) > stats.MaxValueRange:
		return badRequest("the range is over %d days", int(stats.MaxValueRange/(24*time.Hour)))
	}
	h, err := a.stats.ValueHistory(c.Request.Context(), domain, value, from, to)
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, h)
	return nil
}

// statsRecentValues answers GET /api/v1/stats/values/recent: values of a
// domain limited lately or using a quota, by prefix, for autocomplete.
func (a *API) statsRecentValues(c *gin.Context) error {
	domain, err := a.lookupDomain(c)
	if err != nil {
		return err
	}
	prefix, err := lookupParam(c, "prefix", false)
	if err != nil {
		return err
	}
	limit := int64(defaultRecentValues)
	if c.Query("limit") != "" {
		if limit, err = queryInt(c, "limit"); err != nil {
			return err
		}
		if limit < 1 || limit > maxRecentValues {
			return badRequest("query parameter limit must be within 1..%d", maxRecentValues)
		}
	}
	vs, err := a.stats.RecentValues(c.Request.Context(), domain, prefix, int(limit))
	if err != nil {
		return err
	}
	type recent struct {
		Value       string  `json:"value"`
		Limited     int64   `json:"limited"`
		LastLimited *string `json:"last_limited"`
		QuotaUsed   int64   `json:"quota_used"`
	}
	out := make([]recent, len(vs))
	for i, v := range vs {
		out[i] = recent{Value: v.Value, Limited: v.Limited, QuotaUsed: v.QuotaUsed}
		if v.LastLimited != nil {
			s := v.LastLimited.UTC().Format(time.RFC3339)
			out[i].LastLimited = &s
		}
	}
	c.JSON(http.StatusOK, gin.H{"values": out})
	return nil
}
