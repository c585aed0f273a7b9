// Package api is the console's HTTP surface: the REST API under /api/v1, the
// node stream endpoint, health and metrics, and the embedded UI. It is the
// only package that imports gin.
package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/backend/hub"
	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules"
)

// maxBodyBytes bounds every JSON request body.
const maxBodyBytes = 2 << 20

// Config wires the API.
type Config struct {
	Store *store.Store
	Hub   *hub.Hub
	Log   *slog.Logger
	UI    http.Handler // the embedded web UI, served for non-API paths
	// SecureCookies marks session cookies Secure (set when serving TLS or
	// behind a TLS-terminating proxy).
	SecureCookies bool
}

// API serves the console's HTTP routes.
type API struct {
	store  *store.Store
	hub    *hub.Hub
	log    *slog.Logger
	secure bool
	engine *gin.Engine

	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
}

// New builds the router.
func New(cfg Config) *API {
	gin.SetMode(gin.ReleaseMode)
	a := &API{store: cfg.Store, hub: cfg.Hub, log: cfg.Log, secure: cfg.SecureCookies, engine: gin.New()}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_console_http_requests_total", Help: "HTTP requests by route and status code.",
	}, []string{"route", "code"})
	a.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "sluice_console_http_request_seconds", Help: "HTTP request latency by route.",
		Buckets: prometheus.DefBuckets,
	}, []string{"route"})
	reg.MustRegister(a.requests, a.latency,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_console_connected_nodes", Help: "Enforcers connected to this console."},
			func() float64 { return float64(a.hub.Connected()) }))

	r := a.engine
	r.ContextWithFallback = true
	r.Use(a.recover, a.observe, securityHeaders)
	r.GET("/healthz", func(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "ok"}) })
	r.GET("/readyz", a.readyz)
	r.GET("/metrics", gin.WrapH(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})))

	v1 := r.Group("/api/v1", a.authenticate)
	v1.POST("/auth/login", a.login)
	v1.POST("/auth/logout", a.require(store.RoleViewer), a.logout)
	v1.GET("/me", a.require(store.RoleViewer), a.me)

	v1.GET("/ruleset", a.require(store.RoleViewer), a.getRuleset)
	v1.GET("/domains/:domain", a.require(store.RoleViewer), a.getDomain)
	v1.PUT("/domains/:domain", a.require(store.RoleEditor), a.putDomain)
	v1.DELETE("/domains/:domain", a.require(store.RoleEditor), a.deleteDomain)
	v1.GET("/versions", a.require(store.RoleViewer), a.listVersions)
	v1.GET("/versions/:n", a.require(store.RoleViewer), a.getVersion)
	v1.POST("/versions/:n/rollback", a.require(store.RoleEditor), a.rollback)

	v1.GET("/audit", a.require(store.RoleViewer), a.listAudit)
	v1.GET("/audit/verify", a.require(store.RoleViewer), a.verifyAudit)

	v1.POST("/tokens", a.require(store.RoleAdmin), a.createToken)

	v1.GET("/nodes", a.require(store.RoleViewer), a.listNodes)
	v1.GET("/nodes/stream", a.require(store.RoleNode), a.nodeStream)

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
	ctx, cancel := context.WithTimeout(c, 2*time.Second)
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
		ae *apiError
		ve *rules.ValidationError
		ce *store.ConflictError
	)
	switch {
	case errors.As(err, &ae):
		c.AbortWithStatusJSON(ae.status, errorBody(ae.code, ae.message, ae.details))
	case errors.As(err, &ve):
		c.AbortWithStatusJSON(http.StatusUnprocessableEntity, errorBody("invalid", "the rules are not valid", ve.Details()))
	case errors.As(err, &ce):
		c.AbortWithStatusJSON(http.StatusConflict, errorBody("conflict", ce.Error(), gin.H{"changed_in": ce.ChangedIn}))
	case errors.Is(err, rules.ErrConflict):
		c.AbortWithStatusJSON(http.StatusConflict, errorBody("conflict", "conflicts with existing data", nil))
	case errors.Is(err, rules.ErrNotFound):
		c.AbortWithStatusJSON(http.StatusNotFound, errorBody("not_found", "not found", nil))
	case errors.Is(err, context.Canceled):
		c.Abort()
	default:
		a.log.ErrorContext(c, "request failed", "route", c.FullPath(), "request_id", c.GetString("request_id"), "error", err)
		c.AbortWithStatusJSON(http.StatusInternalServerError, errorBody("internal", "internal error", nil))
	}
}

// decode reads a JSON body strictly: bounded size, unknown fields refused.
func decode(c *gin.Context, v any) error {
	body := http.MaxBytesReader(c.Writer, c.Request.Body, maxBodyBytes)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return httpError(http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("request body over %d bytes", maxBodyBytes))
		}
		if errors.Is(err, io.EOF) {
			return httpError(http.StatusBadRequest, "bad_request", "request body is empty")
		}
		return httpError(http.StatusBadRequest, "bad_request", "invalid JSON: "+err.Error())
	}
	if dec.More() {
		return httpError(http.StatusBadRequest, "bad_request", "invalid JSON: trailing data after the object")
	}
	return nil
}

func pathInt(c *gin.Context, name string) (int64, error) {
	n, err := strconv.ParseInt(c.Param(name), 10, 64)
	if err != nil || n <= 0 {
		return 0, httpError(http.StatusBadRequest, "bad_request", fmt.Sprintf("%s must be a positive integer", name))
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
		return 0, httpError(http.StatusBadRequest, "bad_request", fmt.Sprintf("query parameter %s must be a non-negative integer", name))
	}
	return n, nil
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

func (a *API) observe(c *gin.Context) {
	id := c.GetHeader("X-Request-ID")
	if id == "" || len(id) > 128 {
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
	c.Next()
}
