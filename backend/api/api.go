// Package api is the console's HTTP surface: the REST API under /api/v1, the
// node stream endpoint, health and metrics, and the embedded UI. It is the
// only package that imports gin.
package api

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/backend/hub"
	"github.com/sluicehq/sluice/backend/sso"
	"github.com/sluicehq/sluice/backend/stats"
	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/enforcer/limiter"
)

// Body size limits. A domain's YAML travels inside a JSON body, so the
// general limit leaves room for large rule files; sign-in bodies are tiny.
const (
	maxBodyBytes  = 2 << 20
	maxLoginBytes = 16 << 10
)

// Config wires the API.
type Config struct {
	Store *store.Store
	Hub   *hub.Hub
	Stats *stats.Aggregator
	Log   *slog.Logger
	UI    http.Handler // the embedded web UI, served for non-API paths
	// SecureCookies marks session cookies Secure (set when serving TLS or
	// behind a TLS-terminating proxy).
	SecureCookies bool
	// TrustedProxies lists the proxies (IP addresses or CIDRs) whose
	// X-Forwarded-For and X-Real-IP headers name the client. Empty trusts
	// none: the client is the peer address. Entries must be valid (see
	// CheckProxies); invalid ones are ignored.
	TrustedProxies []string
	// MetricsAuth makes /metrics need a credential (viewer or higher, e.g.
	// a scraper's Bearer token); by default it is open, like /healthz.
	MetricsAuth bool
	// LoginThrottle decides sign-in attempts; nil means an in-process
	// token bucket.
	LoginThrottle Throttle
	// Counters is the counter store the enforcers count in, for the
	// support desk's inspect and reset; nil answers them 503.
	Counters *limiter.Redis
	// KeyPrefix starts every counter key, as the enforcers' does
	// (engine.DefaultKeyPrefix when empty).
	KeyPrefix string
	// SSO signs staff in through an OpenID Connect provider; nil turns
	// single sign-on off.
	SSO *sso.Provider
	// PasswordLogin is who may sign in with a password: PasswordLoginAll
	// (also when empty) or PasswordLoginBreakGlass, which admits only
	// BreakGlassUsers.
	PasswordLogin   string
	BreakGlassUsers []string
}

// API serves the console's HTTP routes.
type API struct {
	store    *store.Store
	hub      *hub.Hub
	stats    *stats.Aggregator
	log      *slog.Logger
	secure   bool
	engine   *gin.Engine
	throttle Throttle
	openapi  []byte
	// inspector matches and reads counters for the support desk; nil
	// without a counter store.
	inspector *inspector
	sso       *sso.Provider
	// breakGlass, when not nil, is everyone who may still sign in with a
	// password (PasswordLoginBreakGlass).
	breakGlass map[string]bool
	domains    domainList // GET /domains, per ruleset version

	requests      *prometheus.CounterVec
	latency       *prometheus.HistogramVec
	loginFailures *prometheus.CounterVec
}

// The console never runs gin in debug mode, not even for the throwaway
// engine CheckProxies builds before New.
func init() { gin.SetMode(gin.ReleaseMode) }

// CheckProxies reports the first entry of a trusted-proxy list that is
// neither an IP address nor a CIDR.
func CheckProxies(proxies []string) error {
	if err := gin.New().SetTrustedProxies(proxies); err != nil {
		return fmt.Errorf("trusted proxies: %w", err)
	}
	return nil
}

// New builds the router.
func New(cfg Config) *API {
	a := &API{store: cfg.Store, hub: cfg.Hub, stats: cfg.Stats, log: cfg.Log, secure: cfg.SecureCookies, engine: gin.New(),
		throttle: cfg.LoginThrottle, openapi: openAPIJSON, inspector: newInspector(cfg.Counters, cfg.KeyPrefix), sso: cfg.SSO}
	if cfg.PasswordLogin == PasswordLoginBreakGlass {
		a.breakGlass = map[string]bool{}
		for _, u := range cfg.BreakGlassUsers {
			a.breakGlass[u] = true
		}
	}
	if a.throttle == nil {
		a.throttle = newThrottle(nil)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_console_http_requests_total", Help: "HTTP requests by route and status code.",
	}, []string{"route", "code"})
	a.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "sluice_console_http_request_seconds", Help: "HTTP request latency by route.",
		Buckets: prometheus.DefBuckets,
	}, []string{"route"})
	a.loginFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_console_login_failures_total",
		Help: "Failed sign-ins: audited, over_budget (an existing user's, past the audit budget), unknown_user (never audited) or busy (refused unchecked: too many password checks at once).",
	}, []string{"outcome"})
	reg.MustRegister(a.requests, a.latency, a.loginFailures,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_console_connected_nodes", Help: "Enforcers connected to this console."},
			func() float64 { return float64(a.hub.Connected()) }))
	if a.stats != nil {
		reg.MustRegister(a.stats.Collectors()...)
	}
	if a.hub != nil {
		reg.MustRegister(a.hub.Collectors()...)
	}

	r := a.engine
	r.ContextWithFallback = true
	if err := r.SetTrustedProxies(cfg.TrustedProxies); err != nil {
		a.log.Warn("ignoring invalid trusted proxies", "error", err)
		_ = r.SetTrustedProxies(nil)
	}
	r.Use(a.recover, a.observe, securityHeaders, limitBody, a.checkOrigin, a.checkInput)
	r.GET("/healthz", healthz)
	r.GET("/readyz", a.readyz)
	metrics := gin.WrapH(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	if cfg.MetricsAuth {
		r.GET("/metrics", a.authenticate, a.require(store.RoleViewer), metrics)
	} else {
		r.GET("/metrics", metrics)
	}

	viewer, editor := a.require(store.RoleViewer), a.require(store.RoleEditor)
	// admin is an admin of every domain; scopedAdmin may hold some only
	// (minting tokens no wider than themselves).
	admin, scopedAdmin := a.requireAll(store.RoleAdmin), a.require(store.RoleAdmin)
	v1 := r.Group("/api/v1", a.authenticate)
	v1.GET("/openapi.json", a.h(a.getOpenAPI))
	v1.GET("/schema", getSchema)
	v1.POST("/auth/login", a.h(a.login))
	v1.POST("/auth/logout", viewer, a.h(a.logout))
	v1.GET("/auth/methods", a.h(a.authMethods))
	v1.GET("/auth/oidc/login", a.page(a.oidcLogin))
	v1.GET("/auth/oidc/callback", a.page(a.oidcCallback))
	v1.GET("/me", viewer, a.h(a.me))
	v1.PUT("/me/password", viewer, a.h(a.changePassword))
	v1.GET("/me/sessions", viewer, a.h(a.listMySessions))
	v1.DELETE("/me/sessions", viewer, a.h(a.signOutEverywhere))

	v1.GET("/ruleset", viewer, a.h(a.getRuleset))
	v1.PUT("/ruleset", editor, a.h(a.putRuleset))
	v1.GET("/domains", viewer, a.h(a.listDomains))
	v1.GET("/domains/:domain", viewer, a.h(a.getDomain))
	v1.PUT("/domains/:domain", editor, a.h(a.putDomain))
	v1.DELETE("/domains/:domain", editor, a.h(a.deleteDomain))
	v1.POST("/domains/:domain/rollback", editor, a.h(a.rollbackDomain))
	v1.POST("/preview", editor, a.h(a.preview)) // impact preview of a draft (preview.go)
	v1.GET("/versions", viewer, a.h(a.listVersions))
	v1.GET("/versions/:n", viewer, a.h(a.getVersion))
	v1.GET("/versions/:n/diff/:m", viewer, a.h(a.diffVersions))
	v1.POST("/versions/:n/rollback", editor, a.h(a.rollback))
	v1.POST("/versions/:n/promote", editor, a.h(a.promote))
	v1.GET("/versions/:n/cohorts", viewer, a.h(a.versionCohorts))

	v1.GET("/changes", viewer, a.h(a.listChanges))
	v1.POST("/changes", editor, a.h(a.createChange))
	v1.GET("/changes/:id", viewer, a.h(a.getChange))
	v1.POST("/changes/:id/approve", editor, a.h(a.approveChange))
	v1.POST("/changes/:id/reject", editor, a.h(a.rejectChange))

	support := a.require(store.RoleSupport)
	v1.GET("/overrides", viewer, a.h(a.listOverrides))
	v1.POST("/overrides", support, a.h(a.createOverride))
	v1.GET("/overrides/:id", viewer, a.h(a.getOverride))
	v1.DELETE("/overrides/:id", support, a.h(a.endOverride))

	v1.GET("/settings", viewer, a.h(a.getSettings))
	v1.PUT("/settings", admin, a.h(a.putSettings))

	v1.GET("/audit", viewer, a.h(a.listAudit))
	v1.GET("/audit/verify", viewer, a.h(a.verifyAudit))
	v1.GET("/audit/stream", admin, a.h(a.getAuditStream))
	v1.PUT("/audit/stream", admin, a.h(a.putAuditStream))

	v1.GET("/users", admin, a.h(a.listUsers))
	v1.POST("/users", admin, a.h(a.createUser))
	v1.POST("/users/:id/disable", admin, a.h(a.disableUser))
	v1.POST("/users/:id/enable", admin, a.h(a.enableUser))
	v1.PUT("/users/:id/role", admin, a.h(a.setUserRole))
	v1.PUT("/users/:id/domains", admin, a.h(a.setUserDomains))
	v1.PUT("/users/:id/password", admin, a.h(a.resetPassword))
	v1.GET("/users/:id/sessions", admin, a.h(a.listUserSessions))
	v1.DELETE("/users/:id/sessions", admin, a.h(a.revokeUserSessions))
	v1.DELETE("/users/:id/sessions/:sid", admin, a.h(a.revokeUserSessions))

	v1.GET("/tokens", scopedAdmin, a.h(a.listTokens))
	v1.POST("/tokens", scopedAdmin, a.h(a.createToken))
	v1.POST("/tokens/:id/disable", admin, a.h(a.disableToken))
	v1.POST("/tokens/:id/rotate", admin, a.h(a.rotateToken))
	v1.PUT("/tokens/:id/owner", admin, a.h(a.setTokenOwner))

	v1.GET("/nodes", viewer, a.h(a.listNodes))
	v1.GET("/nodes/stream", a.require(store.RoleNode), a.nodeStream)

	v1.GET("/stats/totals", viewer, a.h(a.statsTotals))
	v1.GET("/stats/live", viewer, a.h(a.statsLive))
	v1.GET("/stats/history", viewer, a.h(a.statsHistory))
	v1.GET("/stats/values", viewer, a.h(a.statsValues))
	v1.GET("/stats/values/recent", viewer, a.h(a.statsRecentValues))
	v1.GET("/stats/domains", viewer, a.h(a.statsDomains))
	v1.GET("/stats/settings", viewer, a.h(a.statsSettings))
	v1.GET("/stats/stream", viewer, a.statsStream)
	v1.GET("/quotas", viewer, a.h(a.listQuotas))
	v1.POST("/inspect", viewer, a.h(a.inspect)) // support desk (inspect.go)
	v1.POST("/inspect/reset", a.require(store.RoleSupport), a.h(a.resetCounters))
	v1.GET("/alerts", admin, a.h(a.getAlerts))
	v1.PUT("/alerts", admin, a.h(a.putAlerts))
	v1.POST("/alerts/test", admin, a.h(a.testAlert))

	r.NoRoute(a.h(func(c *gin.Context) error {
		if strings.HasPrefix(c.Request.URL.Path, "/api/") {
			return httpError(http.StatusNotFound, "not_found", "no such route")
		}
		if cfg.UI == nil {
			return httpError(http.StatusNotFound, "not_found", "no such page")
		}
		cfg.UI.ServeHTTP(c.Writer, c.Request)
		return nil
	}))
	r.NoMethod(a.h(func(c *gin.Context) error {
		return httpError(http.StatusMethodNotAllowed, "method_not_allowed", "method not allowed")
	}))
	r.HandleMethodNotAllowed = true
	return a
}

// ServeHTTP serves the console.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.engine.ServeHTTP(w, r) }
