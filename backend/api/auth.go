package api

import (
	"crypto/subtle"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/backend/store"
)

// Cookie and header names.
const (
	sessionCookie = "sluice_session"
	csrfHeader    = "X-CSRF-Token"
)

// principal is who a request acts as.
type principal struct {
	name     string // audit actor: "user:alice" or "token:deploy#3"
	username string // for users
	role     string
	cookie   bool   // authenticated by session cookie (needs CSRF on writes)
	csrf     string // the session's CSRF token
	secret   string // the session secret, for logout
}

var roleRank = map[string]int{store.RoleViewer: 1, store.RoleEditor: 2, store.RoleAdmin: 3}

// authenticate resolves the caller from a Bearer token or a session cookie.
// A request with neither continues anonymously; one with a bad credential
// is refused here, so a typo never silently downgrades to anonymous.
func (a *API) authenticate(c *gin.Context) {
	if h := c.GetHeader("Authorization"); h != "" {
		secret, ok := strings.CutPrefix(h, "Bearer ")
		if !ok || secret == "" {
			a.fail(c, httpError(http.StatusUnauthorized, "unauthorized", "Authorization must be \"Bearer <token>\""))
			return
		}
		tok, err := a.store.FindToken(c, secret)
		if err != nil {
			a.fail(c, unauthorized(err))
			return
		}
		c.Set("principal", &principal{name: "token:" + tok.Name + "#" + itoa(tok.ID), role: tok.Role})
		c.Next()
		return
	}
	if secret, err := c.Cookie(sessionCookie); err == nil && secret != "" {
		sess, err := a.store.FindSession(c, secret)
		if err == nil {
			c.Set("principal", &principal{name: "user:" + sess.User.Username, username: sess.User.Username,
				role: sess.User.Role, cookie: true, csrf: sess.CSRFToken, secret: secret})
		}
	}
	c.Next()
}

func unauthorized(err error) error {
	var nf = httpError(http.StatusUnauthorized, "unauthorized", "invalid, expired or disabled credentials")
	if isNotFound(err) {
		return nf
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
	act := store.Actor{IP: c.ClientIP(), UserAgent: truncate(c.Request.UserAgent(), 512), RequestID: c.GetString("request_id")}
	if p := caller(c); p != nil {
		act.Name = p.name
	} else {
		act.Name = "anonymous"
	}
	return act
}

type loginRequest struct {
	Username string `json:"username"`
	Password string `json:"password"`
}

func (a *API) login(c *gin.Context) {
	var req loginRequest
	if err := decode(c, &req); err != nil {
		a.fail(c, err)
		return
	}
	if req.Username == "" || req.Password == "" || len(req.Username) > 128 || len(req.Password) > 1024 {
		a.fail(c, httpError(http.StatusBadRequest, "bad_request", "username and password are required"))
		return
	}
	user, err := a.store.Authenticate(c, req.Username, req.Password)
	if err != nil {
		if err == store.ErrBadCredentials {
			act := a.actor(c)
			if rerr := a.store.RecordLogin(c, "auth.login_failed", truncate(req.Username, 128), act); rerr != nil {
				a.fail(c, rerr)
				return
			}
			a.fail(c, httpError(http.StatusUnauthorized, "unauthorized", "invalid username or password"))
			return
		}
		a.fail(c, err)
		return
	}
	act := a.actor(c)
	act.Name = "user:" + user.Username
	secret, csrf, err := a.store.CreateSession(c, user, act)
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
		if err := a.store.DeleteSession(c, p.secret, p.username, a.actor(c)); err != nil {
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
	}
	if p.cookie {
		body["csrf_token"] = p.csrf
	}
	c.JSON(http.StatusOK, body)
}

type tokenRequest struct {
	Name      string `json:"name"`
	Role      string `json:"role"`
	ExpiresIn string `json:"expires_in"` // Go duration, e.g. "720h"; empty = never
}

func (a *API) createToken(c *gin.Context) {
	var req tokenRequest
	if err := decode(c, &req); err != nil {
		a.fail(c, err)
		return
	}
	req.Name = strings.TrimSpace(req.Name)
	if req.Name == "" || len(req.Name) > 128 {
		a.fail(c, httpError(http.StatusBadRequest, "bad_request", "name is required (at most 128 characters)"))
		return
	}
	switch req.Role {
	case store.RoleViewer, store.RoleEditor, store.RoleAdmin, store.RoleNode:
	default:
		a.fail(c, httpError(http.StatusBadRequest, "bad_request", "role must be one of viewer, editor, admin, node"))
		return
	}
	var expires *time.Time
	if req.ExpiresIn != "" {
		d, err := time.ParseDuration(req.ExpiresIn)
		if err != nil || d <= 0 {
			a.fail(c, httpError(http.StatusBadRequest, "bad_request", "expires_in must be a positive duration such as \"720h\""))
			return
		}
		t := time.Now().Add(d).UTC()
		expires = &t
	}
	tok, secret, err := a.store.CreateToken(c, req.Name, req.Role, expires, a.actor(c))
	if err != nil {
		a.fail(c, err)
		return
	}
	c.JSON(http.StatusCreated, gin.H{"id": tok.ID, "token": secret, "name": tok.Name, "role": tok.Role,
		"last4": tok.Last4, "expires_at": tok.ExpiresAt})
}
