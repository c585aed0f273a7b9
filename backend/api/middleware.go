package api

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/backend/store"
)

// The middlewares run before the handlers, in the order New lists them.
// They answer with fail and abort; everything after them is a handler that
// returns its error (see h).

// recover turns a handler's panic into a 500, logged; an
// http.ErrAbortHandler panic passes through, as net/http expects.
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

// observe gives every request an ID (the client's X-Request-ID when it is
// well formed) and counts it by route and status.
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

// securityHeaders sets the CSP and the other browser protections; API
// answers are never cached.
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

// limitBody bounds every request body, whatever the handler does with it,
// and refuses a body that is not declared JSON (415): the API reads no
// other kind. A page on another site can make a browser send a body only
// as a form or text/plain without asking first (a CORS preflight, which
// the console never grants), so this is what keeps a cross-site form from
// signing a victim in (POST /auth/login needs no CSRF token) or reaching
// any other write.
func limitBody(c *gin.Context) {
	if c.Request.ContentLength > maxBodyBytes {
		c.AbortWithStatusJSON(http.StatusRequestEntityTooLarge, errorBody("too_large", fmt.Sprintf("request body over %d bytes", maxBodyBytes), nil))
		return
	}
	if c.Request.ContentLength != 0 && !isJSON(c.GetHeader("Content-Type")) {
		c.AbortWithStatusJSON(http.StatusUnsupportedMediaType, errorBody("unsupported_media_type",
			"a request body must be JSON, sent with Content-Type: application/json", nil))
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

// authenticate resolves the caller from a Bearer token or a session cookie.
// A request with neither continues anonymously; one with a bad credential
// is refused here, so a typo never silently downgrades to anonymous.
// Tokens and sessions are looked up on every request, so a disabled user
// or token, or an expired one, stops working at once.
func (a *API) authenticate(c *gin.Context) {
	if h := c.GetHeader("Authorization"); h != "" {
		secret, ok := strings.CutPrefix(h, "Bearer ")
		if !ok || secret == "" {
			a.fail(c, httpError(http.StatusUnauthorized, "unauthorized", "Authorization must be \"Bearer <token>\""))
			return
		}
		tok, err := a.store.FindToken(c.Request.Context(), secret)
		if err != nil {
			a.fail(c, unauthorized(err))
			return
		}
		c.Set("principal", tokenPrincipal(tok, secret))
		c.Next()
		return
	}
	if secret, err := c.Cookie(sessionCookie); err == nil && secret != "" {
		sess, err := a.store.FindSession(c.Request.Context(), secret)
		switch {
		case err == nil:
			c.Set("principal", sessionPrincipal(sess, secret))
		case !isNotFound(err):
			a.fail(c, err)
			return
		}
	}
	c.Next()
}

func unauthorized(err error) error {
	if isNotFound(err) {
		return httpError(http.StatusUnauthorized, "unauthorized", "invalid, expired or disabled credentials")
	}
	return err
}

// require lets the request through when the caller has at least role.
// The node role is separate: it reaches only node endpoints. Cookie-
// authenticated writes must carry the session's CSRF token, and read-only
// tokens make GET requests only. Domain grants are checked by the handlers
// (requireDomains), except by requireAll.
func (a *API) require(role string) gin.HandlerFunc { return a.requireRole(role, false) }

// requireAll is require for a role that must hold for every domain: the
// console-wide settings and the management of users and other people's
// tokens, which an admin of some domains could otherwise use to widen
// their own grants.
func (a *API) requireAll(role string) gin.HandlerFunc { return a.requireRole(role, true) }

func (a *API) requireRole(role string, all bool) gin.HandlerFunc {
	return func(c *gin.Context) {
		p := caller(c)
		if p == nil {
			a.fail(c, httpError(http.StatusUnauthorized, "unauthorized", "sign in or send a Bearer token"))
			return
		}
		allowed := p.role == role
		if role != store.RoleNode && p.role != store.RoleNode {
			allowed = roleRank[p.role] >= roleRank[role]
		}
		if !allowed {
			a.fail(c, httpError(http.StatusForbidden, "forbidden", "your role ("+p.role+") cannot do this"))
			return
		}
		if all && !p.scope.All {
			a.fail(c, httpError(http.StatusForbidden, "domain_forbidden",
				"your role ("+p.role+") holds for "+p.scope.String()+" only; this needs it for every domain"))
			return
		}
		if p.readOnly && isWrite(c.Request.Method) {
			a.fail(c, httpError(http.StatusForbidden, "read_only", "this token is read-only: it makes GET requests only"))
			return
		}
		if p.cookie && isWrite(c.Request.Method) {
			got := c.GetHeader(csrfHeader)
			if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(p.csrf)) != 1 {
				a.fail(c, httpError(http.StatusForbidden, "csrf", "missing or wrong "+csrfHeader+" header"))
				return
			}
		}
		c.Next()
	}
}

func isWrite(method string) bool {
	return method != http.MethodGet && method != http.MethodHead && method != http.MethodOptions
}

// checkInput refuses a request whose path parameters or query (names and
// values) hold a NUL byte or invalid UTF-8, or whose query values are over
// maxTextBytes, before any handler reads them. It runs after routing, so
// every route's filters are covered, including ones added later.
func (a *API) checkInput(c *gin.Context) {
	for _, p := range c.Params {
		if err := checkText(p.Key, p.Value); err != nil {
			a.fail(c, err)
			return
		}
	}
	for name, values := range c.Request.URL.Query() {
		if err := checkText("query parameter name", name); err != nil {
			a.fail(c, err)
			return
		}
		for _, v := range values {
			if err := checkText("query parameter "+name, v); err != nil {
				a.fail(c, err)
				return
			}
			if len(v) > maxTextBytes {
				a.fail(c, badRequest("query parameter %s is over %d bytes", name, maxTextBytes))
				return
			}
		}
	}
	c.Next()
}
