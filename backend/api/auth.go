package api

import (
	"context"
	"errors"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/backend/hub"
	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/wire"
)

// Cookie and header names.
const (
	sessionCookie = "sluice_session"
	csrfHeader    = "X-CSRF-Token"
)

// Sign-in throttling, each a token bucket per minute (the rate is also the
// burst). Every attempt is charged to its client address and to the pair
// (username, address), so wrong passwords from one address never lock the
// user out of another. Failed attempts are also charged to a per-username
// brake, far higher, against a guess spread over many addresses; the brake
// refuses only addresses that have themselves failed for that username in
// the last failMemory, so a user whose address has no failures always gets
// in.
const (
	loginPerIP     = 20  // attempts per address
	loginPerUserIP = 10  // attempts per (username, address)
	loginBrake     = 100 // failures per username, over every address
	failMemory     = 15 * time.Minute
)

// principal is who a request acts as.
type principal struct {
	name      string      // audit actor: "user:alice" or "token:deploy#3"
	owner     string      // the person who answers for it: the user, or the token's creator
	username  string      // for users
	userID    int64       // for users
	role      string      // what it may do now (a token's effective role)
	scope     store.Scope // the domains role holds for
	readOnly  bool        // a read-only token: GET requests only
	expiresAt *time.Time  // a token's expiry
	tokenID   int64       // for tokens
	sessionID int64       // for sessions
	cookie    bool        // authenticated by session cookie (needs CSRF on writes)
	csrf      string      // the session's CSRF token
	secret    string      // the session's or token's secret: for logout, and checked again by open streams
}

// tokenPrincipal is who a request with tok acts as: the token, for its
// owner, with what the owner holds now (store.Token).
func tokenPrincipal(tok store.Token, secret string) *principal {
	owner := tok.CreatedBy
	if tok.Owner != nil {
		owner = "user:" + *tok.Owner
	}
	return &principal{name: "token:" + tok.Name + "#" + itoa(tok.ID), owner: owner, role: tok.EffectiveRole,
		scope: tok.Scope, readOnly: tok.ReadOnly, expiresAt: tok.ExpiresAt, tokenID: tok.ID, secret: secret}
}

// sessionPrincipal is who a request with a session cookie acts as.
func sessionPrincipal(sess store.Session, secret string) *principal {
	name := "user:" + sess.User.Username
	return &principal{name: name, owner: name, username: sess.User.Username, userID: sess.User.ID,
		role: sess.User.Role, scope: sess.User.Scope(), cookie: true, csrf: sess.CSRFToken, secret: secret, sessionID: sess.ID}
}

var roleRank = store.RoleRank

// stillValid is the check an open stream repeats (hub.Check): the
// credential p signed in with must still work and hold what it held, or
// the stream ends and the client reconnects with what it holds now.
func (a *API) stillValid(p *principal) hub.Check {
	return func(ctx context.Context) string {
		var (
			now *principal
			err error
		)
		switch {
		case p.cookie:
			var sess store.Session
			if sess, err = a.store.CheckSession(ctx, p.secret); err == nil {
				now = sessionPrincipal(sess, p.secret)
			}
		case p.tokenID != 0:
			var tok store.Token
			if tok, err = a.store.FindToken(ctx, p.secret); err == nil {
				now = tokenPrincipal(tok, p.secret)
			}
		default:
			return ""
		}
		switch {
		case isNotFound(err):
			return "credentials revoked or expired: sign in again"
		case err != nil:
			return "" // cannot tell; the next check decides
		case now.role != p.role || !slices.Equal(now.scope.Domains, p.scope.Domains) || now.scope.All != p.scope.All:
			return "your role or domains changed: reconnect"
		}
		return ""
	}
}

func caller(c *gin.Context) *principal {
	p, _ := c.Get("principal")
	pr, _ := p.(*principal)
	return pr
}

func (a *API) actor(c *gin.Context) store.Actor {
	// A User-Agent is not refused for invalid UTF-8 (net/http lets such
	// bytes through), but Postgres would refuse it in the audit row.
	ua := wire.Cut(strings.ToValidUTF8(c.Request.UserAgent(), "\uFFFD"), 512)
	act := store.Actor{IP: c.ClientIP(), UserAgent: ua, RequestID: c.GetString("request_id")}
	if p := caller(c); p != nil {
		act.Name, act.Owner = p.name, p.owner
	} else {
		act.Name = "anonymous"
	}
	return act
}

// allowAttempt decides one sign-in attempt for username from the client
// address (see loginPerIP). When it is refused it sets Retry-After and
// returns a 429 error; the message names neither the user nor whether it
// exists.
func (a *API) allowAttempt(c *gin.Context, username string) error {
	user, ip := strings.ToLower(username), c.ClientIP()
	peek, err := a.throttle.Take(c.Request.Context(), []limiter.Request{failedMark(user, ip, 0), brake(user, 0)})
	if err != nil {
		return err
	}
	var wait time.Duration
	if peek[0].Remaining < 1 && peek[1].Remaining < 1 {
		wait = time.Minute / loginBrake // one failure's worth of the brake refills
	} else {
		ds, err := a.throttle.Take(c.Request.Context(), []limiter.Request{
			{Key: "login:ip:" + ip, Algorithm: rules.TokenBucket, Limit: loginPerIP, Period: time.Minute, Hits: 1},
			{Key: "login:ip-user:" + ip + "|" + user, Algorithm: rules.TokenBucket, Limit: loginPerUserIP, Period: time.Minute, Hits: 1},
		})
		if err != nil {
			return err
		}
		for _, d := range ds {
			if !d.Allowed {
				wait = max(wait, d.RetryAfter)
			}
		}
	}
	if wait == 0 {
		return nil
	}
	secs := int(math.Ceil(wait.Seconds()))
	a.log.WarnContext(c, "sign-in throttled", "ip", ip, "request_id", c.GetString("request_id"))
	c.Header("Retry-After", strconv.Itoa(secs))
	return httpError(http.StatusTooManyRequests, "too_many_attempts",
		"too many sign-in attempts; try again in "+strconv.Itoa(secs)+" s")
}

// Failed sign-ins in the audit trail: only for usernames that exist (a
// typed username may be a password typed into the wrong field), and at
// most loginAuditPerHour per user, so anonymous clients cannot grow the
// trail without bound. Every failure is counted in
// sluice_console_login_failures_total{audited}.
const loginAuditPerHour = 20

// recordFailedLogin audits or counts a failed sign-in (see loginAuditPerHour).
func (a *API) recordFailedLogin(c *gin.Context, username string, err error) error {
	if errors.Is(err, store.ErrUnknownUser) {
		a.loginFailures.WithLabelValues("unknown_user").Inc()
		return nil
	}
	ds, terr := a.throttle.Take(c.Request.Context(), []limiter.Request{{Key: "login:audit:" + username,
		Algorithm: rules.TokenBucket, Limit: loginAuditPerHour, Period: time.Hour, Hits: 1}})
	if terr != nil {
		return terr
	}
	if !ds[0].Allowed {
		a.loginFailures.WithLabelValues("over_budget").Inc()
		return nil
	}
	a.loginFailures.WithLabelValues("audited").Inc()
	return a.store.RecordLogin(c.Request.Context(), "auth.login_failed", username, a.actor(c))
}

// failedAttempt charges a failed sign-in to the username's brake and marks
// the address as having failed for it.
func (a *API) failedAttempt(c *gin.Context, username string) error {
	user, ip := strings.ToLower(username), c.ClientIP()
	// Two Takes: the brake being empty must not keep the mark from being set.
	if _, err := a.throttle.Take(c.Request.Context(), []limiter.Request{brake(user, 1)}); err != nil {
		return err
	}
	_, err := a.throttle.Take(c.Request.Context(), []limiter.Request{failedMark(user, ip, 1)})
	return err
}

// failedMark is a bucket of one that a failure empties and that is full
// again failMemory later: empty means the address failed for the user.
func failedMark(user, ip string, hits int64) limiter.Request {
	return limiter.Request{Key: "login:failed:" + ip + "|" + user, Algorithm: rules.TokenBucket, Limit: 1, Period: failMemory, Hits: hits}
}

func brake(user string, hits int64) limiter.Request {
	return limiter.Request{Key: "login:brake:" + user, Algorithm: rules.TokenBucket, Limit: loginBrake, Period: time.Minute, Hits: hits}
}

type loginRequest struct {
	Username string `json:"username"`
	Password string `json:"password"`
}

func (a *API) login(c *gin.Context) error {
	var req loginRequest
	if err := decodeLimit(c, &req, maxLoginBytes, false); err != nil {
		return err
	}
	if req.Username == "" || req.Password == "" || len(req.Username) > 128 {
		return badRequest("username and password are required")
	}
	if err := a.allowAttempt(c, req.Username); err != nil {
		return err
	}
	if err := a.passwordAllowed(req.Username); err != nil {
		return err
	}
	user, err := a.store.Authenticate(c.Request.Context(), req.Username, req.Password)
	if errors.Is(err, store.ErrPasswordsBusy) {
		a.loginFailures.WithLabelValues("busy").Inc() // answered 503 by fail
	}
	if errors.Is(err, store.ErrBadCredentials) {
		if ferr := a.failedAttempt(c, req.Username); ferr != nil {
			return ferr
		}
		if rerr := a.recordFailedLogin(c, req.Username, err); rerr != nil {
			return rerr
		}
		return httpError(http.StatusUnauthorized, "unauthorized", "invalid username or password")
	}
	if err != nil {
		return err
	}
	act := a.actor(c)
	act.Name = "user:" + user.Username
	secret, csrf, err := a.store.CreateSession(c.Request.Context(), user, act)
	if err != nil {
		return err
	}
	a.setSessionCookie(c, secret)
	c.JSON(http.StatusOK, gin.H{"csrf_token": csrf, "user": user})
	return nil
}

func (a *API) logout(c *gin.Context) error {
	p := caller(c)
	if p.cookie {
		if err := a.store.DeleteSession(c.Request.Context(), p.secret, p.username, a.actor(c)); err != nil {
			return err
		}
	}
	http.SetCookie(c.Writer, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
		Secure: a.secure || c.Request.TLS != nil, SameSite: http.SameSiteStrictMode})
	c.Status(http.StatusNoContent)
	return nil
}

func (a *API) me(c *gin.Context) error {
	p := caller(c)
	domains := p.scope.Domains
	if domains == nil {
		domains = []string{}
	}
	body := gin.H{"name": p.name, "role": p.role, "domains": domains, "all_domains": p.scope.All, "read_only": p.readOnly}
	if p.username != "" {
		body["username"] = p.username
		body["id"] = p.userID
	}
	if p.cookie {
		body["csrf_token"] = p.csrf
	}
	c.JSON(http.StatusOK, body)
	return nil
}

type passwordChangeRequest struct {
	CurrentPassword string `json:"current_password"`
	NewPassword     string `json:"new_password"`
}

// changePassword lets a signed-in user change their own password. Their
// other sessions end; this one stays.
func (a *API) changePassword(c *gin.Context) error {
	p := caller(c)
	if p.userID == 0 {
		return httpError(http.StatusForbidden, "forbidden", "only a signed-in user has a password to change")
	}
	var req passwordChangeRequest
	if err := decodeLimit(c, &req, maxLoginBytes, false); err != nil {
		return err
	}
	if err := checkPassword(req.NewPassword); err != nil {
		return err
	}
	if err := a.allowAttempt(c, p.username); err != nil {
		return err
	}
	err := a.store.ChangePassword(c.Request.Context(), p.userID, req.CurrentPassword, req.NewPassword, p.secret, a.actor(c))
	if errors.Is(err, store.ErrBadCredentials) {
		if ferr := a.failedAttempt(c, p.username); ferr != nil {
			return ferr
		}
		return httpError(http.StatusForbidden, "wrong_password", "the current password is wrong")
	}
	if err != nil {
		return err
	}
	c.Status(http.StatusNoContent)
	return nil
}
