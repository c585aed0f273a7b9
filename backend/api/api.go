// Package api is the console's HTTP surface: the REST API under /api/v1, the
// node stream endpoint, health and metrics, and the embedded UI. It is the
// only package that imports gin.
package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/backend/hub"
	"github.com/sluicehq/sluice/backend/stats"
	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules"
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
		throttle: cfg.LoginThrottle, openapi: openAPIJSON}
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
		Help: "Failed sign-ins: audited, over_budget (an existing user's, past the audit budget) or unknown_user (never audited).",
	}, []string{"outcome"})
	reg.MustRegister(a.requests, a.latency, a.loginFailures,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_console_connected_nodes", Help: "Enforcers connected to this console."},
			func() float64 { return float64(a.hub.Connected()) }))

	r := a.engine
	r.ContextWithFallback = true
	if err := r.SetTrustedProxies(cfg.TrustedProxies); err != nil {
		a.log.Warn("ignoring invalid trusted proxies", "error", err)
		_ = r.SetTrustedProxies(nil)
	}
	r.Use(a.recover, a.observe, securityHeaders, limitBody, a.checkOrigin, a.checkInput)
	r.GET("/healthz", func(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "ok"}) })
	r.GET("/readyz", a.readyz)
	metrics := gin.WrapH(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	if cfg.MetricsAuth {
		r.GET("/metrics", a.authenticate, a.require(store.RoleViewer), metrics)
	} else {
		r.GET("/metrics", metrics)
	}

	viewer, editor, admin := a.require(store.RoleViewer), a.require(store.RoleEditor), a.require(store.RoleAdmin)
	v1 := r.Group("/api/v1", a.authenticate)
	v1.GET("/openapi.json", a.getOpenAPI)
	v1.GET("/schema", getSchema)
	v1.POST("/auth/login", a.login)
	v1.POST("/auth/logout", viewer, a.logout)
	v1.GET("/me", viewer, a.me)
	v1.PUT("/me/password", viewer, a.changePassword)

	v1.GET("/ruleset", viewer, a.getRuleset)
	v1.GET("/domains", viewer, a.listDomains)
	v1.GET("/domains/:domain", viewer, a.getDomain)
	v1.PUT("/domains/:domain", editor, a.putDomain)
	v1.DELETE("/domains/:domain", editor, a.deleteDomain)
	v1.POST("/domains/:domain/rollback", editor, a.rollbackDomain)
	v1.GET("/versions", viewer, a.listVersions)
	v1.GET("/versions/:n", viewer, a.getVersion)
	v1.GET("/versions/:n/diff/:m", viewer, a.diffVersions)
	v1.POST("/versions/:n/rollback", editor, a.rollback)

	v1.GET("/changes", viewer, a.listChanges)
	v1.POST("/changes", editor, a.createChange)
	v1.GET("/changes/:id", viewer, a.getChange)
	v1.POST("/changes/:id/approve", editor, a.approveChange)
	v1.POST("/changes/:id/reject", editor, a.rejectChange)

	v1.GET("/settings", viewer, a.getSettings)
	v1.PUT("/settings", admin, a.putSettings)

	v1.GET("/audit", viewer, a.listAudit)
	v1.GET("/audit/verify", viewer, a.verifyAudit)

	v1.GET("/users", admin, a.listUsers)
	v1.POST("/users", admin, a.createUser)
	v1.POST("/users/:id/disable", admin, a.disableUser)
	v1.POST("/users/:id/enable", admin, a.enableUser)
	v1.PUT("/users/:id/role", admin, a.setUserRole)
	v1.PUT("/users/:id/password", admin, a.resetPassword)

	v1.GET("/tokens", admin, a.listTokens)
	v1.POST("/tokens", admin, a.createToken)
	v1.POST("/tokens/:id/disable", admin, a.disableToken)
	v1.POST("/tokens/:id/rotate", admin, a.rotateToken)

	v1.GET("/nodes", viewer, a.listNodes)
	v1.GET("/nodes/stream", a.require(store.RoleNode), a.nodeStream)

	v1.GET("/stats/totals", viewer, a.h(a.statsTotals))
	v1.GET("/stats/live", viewer, a.h(a.statsLive))
	v1.GET("/stats/history", viewer, a.h(a.statsHistory))
	v1.GET("/stats/domains", viewer, a.h(a.statsDomains))
	v1.GET("/stats/settings", viewer, a.h(a.statsSettings))
	v1.GET("/stats/stream", viewer, a.statsStream)
	v1.GET("/alerts", admin, a.h(a.getAlerts))
	v1.PUT("/alerts", admin, a.h(a.putAlerts))
	v1.POST("/alerts/test", admin, a.h(a.testAlert))

	r.NoRoute(func(c *gin.Context) {
		if strings.HasPrefix(c.Request.URL.Path, "/api/") {
			a.fail(c, httpError(http.StatusNotFound, "not_found", "no such route"))
			return
		}
		if cfg.UI == nil {
			a.fail(c, httpError(http.StatusNotFound, "not_found", "no such page"))
			return
		}
		cfg.UI.ServeHTTP(c.Writer, c.Request)
	})
	r.NoMethod(func(c *gin.Context) {
		a.fail(c, httpError(http.StatusMethodNotAllowed, "method_not_allowed", "method not allowed"))
	})
	r.HandleMethodNotAllowed = true
	return a
}

// ServeHTTP serves the console.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.engine.ServeHTTP(w, r) }

func (a *API) readyz(c *gin.Context) {
	ctx, cancel := context.WithTimeout(c.Request.Context(), 2*time.Second)
	defer cancel()
	if err := a.store.Ready(ctx); err != nil {
		c.JSON(http.StatusServiceUnavailable, gin.H{"status": "unavailable", "reason": "database not reachable or not migrated"})
		return
	}
	c.JSON(http.StatusOK, gin.H{"status": "ready"})
}

// apiError is an error with a status and a message that is safe to show.
type apiError struct {
	status  int
	code    string
	message string
	details any
}

func (e *apiError) Error() string { return e.message }

func httpError(status int, code, message string) *apiError {
	return &apiError{status: status, code: code, message: message}
}

func badRequest(format string, args ...any) *apiError {
	return httpError(http.StatusBadRequest, "bad_request", fmt.Sprintf(format, args...))
}

func errorBody(code, message string, details any) gin.H {
	body := gin.H{"code": code, "message": message}
	if details != nil {
		body["details"] = details
	}
	return gin.H{"error": body}
}

// fail maps an error to its HTTP answer, in this one place. Errors it does
// not know become a 500 without their text.
func (a *API) fail(c *gin.Context, err error) {
	var (
		ae  *apiError
		ve  *rules.ValidationError
		ce  *store.ConflictError
		ie  *store.InvalidError
		re  *store.RefusedError
		te  *store.SnapshotTooLargeError
		big *http.MaxBytesError
	)
	switch {
	case errors.As(err, &ae):
		c.AbortWithStatusJSON(ae.status, errorBody(ae.code, ae.message, ae.details))
	case errors.As(err, &ve):
		c.AbortWithStatusJSON(http.StatusUnprocessableEntity, errorBody("invalid", "the rules are not valid", ve.Details()))
	case errors.As(err, &ce):
		c.AbortWithStatusJSON(http.StatusConflict, errorBody("conflict", ce.Error(), gin.H{"changed_in": ce.ChangedIn, "base_version": ce.Base}))
	case errors.As(err, &ie):
		c.AbortWithStatusJSON(http.StatusBadRequest, errorBody("bad_request", ie.Reason, nil))
	case errors.As(err, &te):
		c.AbortWithStatusJSON(http.StatusUnprocessableEntity, errorBody("snapshot_too_large", te.Error(),
			gin.H{"bytes": te.Bytes, "max_bytes": te.Max}))
	case errors.As(err, &re):
		c.AbortWithStatusJSON(http.StatusConflict, errorBody("conflict", re.Reason, nil))
	case errors.Is(err, store.ErrSelfApproval):
		c.AbortWithStatusJSON(http.StatusForbidden, errorBody("self_approval", "a change needs a second person: its author cannot approve it", nil))
	case errors.Is(err, store.ErrApprovalRequired):
		c.AbortWithStatusJSON(http.StatusConflict, errorBody("approval_required", "changes need approval; propose one with POST /api/v1/changes", nil))
	case errors.Is(err, rules.ErrConflict):
		c.AbortWithStatusJSON(http.StatusConflict, errorBody("conflict", "conflicts with existing data", nil))
	case errors.Is(err, rules.ErrNotFound):
		c.AbortWithStatusJSON(http.StatusNotFound, errorBody("not_found", "not found", nil))
	case errors.As(err, &big):
		c.AbortWithStatusJSON(http.StatusRequestEntityTooLarge, errorBody("too_large", fmt.Sprintf("request body over %d bytes", big.Limit), nil))
	case errors.Is(err, context.Canceled):
		c.Abort()
	default:
		a.log.ErrorContext(c, "request failed", "route", c.FullPath(), "request_id", c.GetString("request_id"), "error", err)
		c.AbortWithStatusJSON(http.StatusInternalServerError, errorBody("internal", "internal error", nil))
	}
}

// h adapts a handler that returns an error: fail answers for it.
func (a *API) h(fn func(c *gin.Context) error) gin.HandlerFunc {
	return func(c *gin.Context) {
		if err := fn(c); err != nil {
			a.fail(c, err)
		}
	}
}

func pathInt(c *gin.Context, name string) (int64, error) {
	n, err := strconv.ParseInt(c.Param(name), 10, 64)
	if err != nil || n <= 0 {
		return 0, badRequest("%s must be a positive integer", name)
	}
	return n, nil
}

func queryInt(c *gin.Context, name string) (int64, error) {
	s := c.Query(name)
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, badRequest("query parameter %s must be a non-negative integer", name)
	}
	return n, nil
}

func queryTime(c *gin.Context, name string) (time.Time, error) {
	s := c.Query(name)
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, badRequest("query parameter %s must be an RFC 3339 time like 2025-01-31T12:00:00Z", name)
	}
	return t, nil
}

// page reads the cursor pagination parameters ?cursor= and ?limit=.
func page(c *gin.Context) (cursor int64, limit int, err error) {
	if cursor, err = queryInt(c, "cursor"); err != nil {
		return 0, 0, err
	}
	l, err := queryInt(c, "limit")
	if err != nil {
		return 0, 0, err
	}
	if l > 1000 {
		return 0, 0, badRequest("query parameter limit must be at most 1000")
	}
	return cursor, int(l), nil
}

// nextCursor renders a store's next-page cursor: null on the last page.
func nextCursor(next int64) *string {
	if next == 0 {
		return nil
	}
	s := strconv.FormatInt(next, 10)
	return &s
}

func (a *API) recover(c *gin.Context) {
	defer func() {
		if r := recover(); r != nil {
			if r == http.ErrAbortHandler {
				panic(r)
			}
			a.log.ErrorContext(c, "panic serving request", "route", c.FullPath(), "panic", fmt.Sprint(r))
			c.AbortWithStatusJSON(http.StatusInternalServerError, errorBody("internal", "internal error", nil))
		}
	}()
	c.Next()
}

// requestIDPattern is what a client-supplied X-Request-ID may look like; it
// ends up in logs and the audit trail.
var requestIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

func (a *API) observe(c *gin.Context) {
	id := c.GetHeader("X-Request-ID")
	if !requestIDPattern.MatchString(id) {
		b := make([]byte, 8)
		rand.Read(b)
		id = hex.EncodeToString(b)
	}
	c.Set("request_id", id)
	c.Header("X-Request-ID", id)
	start := time.Now()
	c.Next()
	route := c.FullPath()
	if route == "" {
		route = "unmatched"
	}
	a.requests.WithLabelValues(route, strconv.Itoa(c.Writer.Status())).Inc()
	a.latency.WithLabelValues(route).Observe(time.Since(start).Seconds())
}

func securityHeaders(c *gin.Context) {
	h := c.Writer.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	if strings.HasPrefix(c.Request.URL.Path, "/api/") {
		h.Set("Cache-Control", "no-store")
	}
	c.Next()
}

// limitBody bounds every request body, whatever the handler does with it.
func limitBody(c *gin.Context) {
	if c.Request.ContentLength > maxBodyBytes {
		c.AbortWithStatusJSON(http.StatusRequestEntityTooLarge, errorBody("too_large", fmt.Sprintf("request body over %d bytes", maxBodyBytes), nil))
		return
	}
	c.Request.Body = http.MaxBytesReader(c.Writer, c.Request.Body, maxBodyBytes)
	c.Next()
}

// checkOrigin refuses a browser's cross-origin websocket handshake. Browsers
// send cookies with websocket handshakes and apply no CORS to them, so a
// foreign page could otherwise open a stream as the signed-in user.
// Enforcers and other programs send no Origin and are not affected.
func (a *API) checkOrigin(c *gin.Context) {
	origin := c.GetHeader("Origin")
	if origin == "" || !strings.EqualFold(c.GetHeader("Upgrade"), "websocket") {
		c.Next()
		return
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" || !strings.EqualFold(u.Host, c.Request.Host) {
		a.fail(c, httpError(http.StatusForbidden, "forbidden_origin", "cross-origin websocket refused"))
		return
	}
	c.Next()
}
