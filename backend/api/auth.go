package api

import (
	"crypto/subtle"
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/rules"
)

// Cookie and header names.
const (
	sessionCookie = "sluice_session"
	csrfHeader    = "X-CSRF-Token"
)

// Sign-in throttling: attempts per client address and per username, each a
// token bucket. Both are charged on every attempt, successful or not.
const (
	loginPerIP   = 20 // per minute, also the burst
	loginPerUser = 10 // per minute, also the burst
)

// principal is who a request acts as.
type principal struct {
	name     string // audit actor: "user:alice" or "token:deploy#3"
	owner    string // the person who answers for it: the user, or the token's creator
	username string // for users
	userID   int64  // for users
	role     string
	cookie   bool   // authenticated by session cookie (needs CSRF on writes)
	csrf     string // the session's CSRF token
	secret   string // the session secret, for logout
}

var roleRank = map[string]int{store.RoleViewer: 1, store.RoleEditor: 2, store.RoleAdmin: 3}

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
		c.Set("principal", &principal{name: "token:" + tok.Name + "#" + itoa(tok.ID), owner: tok.CreatedBy, role: tok.Role})
		c.Next()
		return
	}
	if secret, err := c.Cookie(sessionCookie); err == nil && secret != "" {
		sess, err := a.store.FindSession(c.Request.Context(), secret)
		switch {
		case err == nil:
			name := "user:" + sess.User.Username
			c.Set("principal", &principal{name: name, owner: name, username: sess.User.Username, userID: sess.User.ID,
				role: sess.User.Role, cookie: true, csrf: sess.CSRFToken, secret: secret})
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
// authenticated writes must carry the session's CSRF token.
func (a *API) require(role string) gin.HandlerFunc {
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

func caller(c *gin.Context) *principal {
	p, _ := c.Get("principal")
	pr, _ := p.(*principal)
	return pr
}

func (a *API) actor(c *gin.Context) store.Actor {
	// A User-Agent is not refused for invalid UTF-8 (net/http lets such
	// bytes through), but Postgres would refuse it in the audit row.
	ua := truncate(strings.ToValidUTF8(c.Request.UserAgent(), "\uFFFD"), 512)
	act := store.Actor{IP: c.ClientIP(), UserAgent: ua, RequestID: c.GetString("request_id")}
	if p := caller(c); p != nil {
		act.Name, act.Owner = p.name, p.owner
	} else {
		act.Name = "anonymous"
	}
	return act
}

// allowAttempt charges one sign-in attempt to the client address and to the
// username. When either is exhausted it answers 429 with Retry-After and
// returns false; the message names neither, nor whether the user exists.
func (a *API) allowAttempt(c *gin.Context, username string) bool {
	reqs := []limiter.Request{
		{Key: "login:ip:" + c.ClientIP(), Algorithm: rules.TokenBucket, Limit: loginPerIP, Period: time.Minute, Hits: 1},
		{Key: "login:user:" + strings.ToLower(username), Algorithm: rules.TokenBucket, Limit: loginPerUser, Period: time.Minute, Hits: 1},
	}
	ds, err := a.throttle.Take(c.Request.Context(), reqs)
	if err != nil {
		a.fail(c, err)
		return false
	}
	var wait time.Duration
	for _, d := range ds {
		if !d.Allowed {
			wait = max(wait, d.RetryAfter)
		}
	}
	if wait == 0 {
		return true
	}
	secs := int(math.Ceil(wait.Seconds()))
	a.log.WarnContext(c, "sign-in throttled", "ip", c.ClientIP(), "request_id", c.GetString("request_id"))
	c.Header("Retry-After", strconv.Itoa(secs))
	a.fail(c, httpError(http.StatusTooManyRequests, "too_many_attempts",
		"too many sign-in attempts; try again in "+strconv.Itoa(secs)+" s"))
	return false
}

type loginRequest struct {
	Username string `json:"username"`
	Password string `json:"password"`
}

func (a *API) login(c *gin.Context) {
	var req loginRequest
	if err := decodeLimit(c, &req, maxLoginBytes, false); err != nil {
		a.fail(c, err)
		return
	}
	if req.Username == "" || req.Password == "" || len(req.Username) > 128 {
		a.fail(c, badRequest("username and password are required"))
		return
	}
	if !a.allowAttempt(c, req.Username) {
		return
	}
	user, err := a.store.Authenticate(c.Request.Context(), req.Username, req.Password)
	if errors.Is(err, store.ErrBadCredentials) {
		if rerr := a.store.RecordLogin(c.Request.Context(), "auth.login_failed", req.Username, a.actor(c)); rerr != nil {
			a.fail(c, rerr)
			return
		}
		a.fail(c, httpError(http.StatusUnauthorized, "unauthorized", "invalid username or password"))
		return
	}
	if err != nil {
		a.fail(c, err)
		return
	}
	act := a.actor(c)
	act.Name = "user:" + user.Username
	secret, csrf, err := a.store.CreateSession(c.Request.Context(), user, act)
	if err != nil {
		a.fail(c, err)
		return
	}
	http.SetCookie(c.Writer, &http.Cookie{
		Name: sessionCookie, Value: secret, Path: "/", HttpOnly: true, Secure: a.secure || c.Request.TLS != nil,
		SameSite: http.SameSiteStrictMode, Expires: time.Now().Add(store.SessionAbsolute),
	})
	c.JSON(http.StatusOK, gin.H{"csrf_token": csrf, "user": user})
}

func (a *API) logout(c *gin.Context) {
	p := caller(c)
	if p.cookie {
		if err := a.store.DeleteSession(c.Request.Context(), p.secret, p.username, a.actor(c)); err != nil {
			a.fail(c, err)
			return
		}
	}
	http.SetCookie(c.Writer, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
		Secure: a.secure || c.Request.TLS != nil, SameSite: http.SameSiteStrictMode})
	c.Status(http.StatusNoContent)
}

func (a *API) me(c *gin.Context) {
	p := caller(c)
	body := gin.H{"name": p.name, "role": p.role}
	if p.username != "" {
		body["username"] = p.username
		body["id"] = p.userID
	}
	if p.cookie {
		body["csrf_token"] = p.csrf
	}
	c.JSON(http.StatusOK, body)
}

type passwordChangeRequest struct {
	CurrentPassword string `json:"current_password"`
	NewPassword     string `json:"new_password"`
}

// changePassword lets a signed-in user change their own password. Their
// other sessions end; this one stays.
func (a *API) changePassword(c *gin.Context) {
	p := caller(c)
	if p.userID == 0 {
		a.fail(c, httpError(http.StatusForbidden, "forbidden", "only a signed-in user has a password to change"))
		return
	}
	var req passwordChangeRequest
	if err := decodeLimit(c, &req, maxLoginBytes, false); err != nil {
		a.fail(c, err)
		return
	}
	if err := checkPassword(req.NewPassword); err != nil {
		a.fail(c, err)
		return
	}
	if !a.allowAttempt(c, p.username) {
		return
	}
	err := a.store.ChangePassword(c.Request.Context(), p.userID, req.CurrentPassword, req.NewPassword, p.secret, a.actor(c))
	if errors.Is(err, store.ErrBadCredentials) {
		a.fail(c, httpError(http.StatusForbidden, "wrong_password", "the current password is wrong"))
		return
	}
	if err != nil {
		a.fail(c, err)
		return
	}
	c.Status(http.StatusNoContent)
}
