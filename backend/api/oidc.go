package api

import (
	"bytes"
	"crypto/subtle"
	"errors"
	"html/template"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/backend/sso"
	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/rules"
)

// Password sign-in policies (Config.PasswordLogin).
const (
	// PasswordLoginAll lets every user sign in with a password.
	PasswordLoginAll = "all"
	// PasswordLoginBreakGlass lets only Config.BreakGlassUsers sign in
	// with a password; everyone else signs in through the identity
	// provider.
	PasswordLoginBreakGlass = "break-glass"
)

// oidcStateCookie carries a sign-in's state from the redirect to the
// provider back to the callback. It is SameSite=Lax because the callback
// is a top-level navigation from the provider's site; the session cookie
// stays Strict.
const oidcStateCookie = "sluice_oidc_state"

// oidcStartsPerIP bounds how many sign-ins one address may start a minute:
// each one is a row until it completes or expires.
const oidcStartsPerIP = 30

// authMethods tells the login page how people sign in here.
func (a *API) authMethods(c *gin.Context) error {
	password := PasswordLoginAll
	if a.breakGlass != nil {
		password = PasswordLoginBreakGlass
	}
	c.JSON(http.StatusOK, gin.H{"password": password, "oidc": a.sso != nil})
	return nil
}

// passwordAllowed refuses a password sign-in that the policy turns off.
func (a *API) passwordAllowed(username string) error {
	if a.breakGlass == nil || a.breakGlass[username] {
		return nil
	}
	return httpError(http.StatusForbidden, "password_login_disabled",
		"password sign-in is turned off here except for break-glass accounts: sign in with SSO")
}

// setSessionCookie hands the browser a session's secret; every way of
// signing in ends here.
func (a *API) setSessionCookie(c *gin.Context, secret string) {
	http.SetCookie(c.Writer, &http.Cookie{
		Name: sessionCookie, Value: secret, Path: "/", HttpOnly: true, Secure: a.secure || c.Request.TLS != nil,
		SameSite: http.SameSiteStrictMode, Expires: time.Now().Add(store.SessionAbsolute),
	})
}

// pageError is a sign-in failure shown to a person as a page.
type pageError struct {
	status  int
	title   string
	message string
}

func (e *pageError) Error() string { return e.title + ": " + e.message }

// page adapts a browser-navigation handler: its errors become an HTML page
// that says what happened and links back to the sign-in page (where a
// break-glass password still works).
func (a *API) page(fn func(c *gin.Context) error) gin.HandlerFunc {
	return func(c *gin.Context) {
		err := fn(c)
		if err == nil {
			return
		}
		var (
			pe *pageError
			ae *apiError
		)
		if !errors.As(err, &pe) && errors.As(err, &ae) {
			a.fail(c, err) // not a sign-in to explain (SSO not configured)
			return
		}
		if pe == nil {
			a.log.ErrorContext(c, "sign-in failed", "route", c.FullPath(), "request_id", c.GetString("request_id"), "error", err)
			pe = &pageError{status: http.StatusInternalServerError, title: "Sign-in failed", message: "The console could not complete the sign-in. Try again."}
		}
		var buf bytes.Buffer
		if err := signInPage.Execute(&buf, pe); err != nil {
			buf.Reset()
			buf.WriteString("sign-in failed")
		}
		c.Header("Cache-Control", "no-store")
		c.Data(pe.status, "text/html; charset=utf-8", buf.Bytes())
		c.Abort()
	}
}

var signInPage = template.Must(template.New("signin").Parse(`<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>{{.Title}} · Sluice</title></head>
<body>
<main>
<h1>{{.Title}}</h1>
<p role="alert">{{.Message}}</p>
<p><a href="/">Back to sign-in</a></p>
</main>
</body>
</html>
`))

// Title and Message are what the page template reads.
func (e *pageError) Title() string   { return e.title }
func (e *pageError) Message() string { return e.message }

func ssoNotConfigured() error {
	return httpError(http.StatusNotFound, "not_configured", "single sign-on is not configured on this console")
}

// oidcLogin starts a sign-in at the identity provider: it keeps the flow's
// nonce and PKCE verifier under its state and redirects the browser to the
// provider. return_to is the console path to land on afterwards.
func (a *API) oidcLogin(c *gin.Context) error {
	if a.sso == nil {
		return ssoNotConfigured()
	}
	ip := c.ClientIP()
	ds, err := a.throttle.Take(c.Request.Context(), []limiter.Request{{Key: "oidc:start:" + ip, Algorithm: rules.TokenBucket,
		Limit: oidcStartsPerIP, Period: time.Minute, Hits: 1}})
	if err != nil {
		return err
	}
	if !ds[0].Allowed {
		return &pageError{status: http.StatusTooManyRequests, title: "Too many sign-ins",
			message: "Too many sign-ins were started from your address. Wait a minute and try again."}
	}
	flow, target, err := a.sso.Start(c.Request.Context())
	var ue *sso.UnavailableError
	if errors.As(err, &ue) {
		a.log.WarnContext(c, "identity provider unavailable", "step", ue.Step, "issuer", a.sso.Issuer(), "error", ue.Err)
		return providerUnavailable()
	}
	if err != nil {
		return err
	}
	err = a.store.CreateOIDCFlow(c.Request.Context(), flow.State, store.OIDCFlow{Nonce: flow.Nonce, Verifier: flow.Verifier,
		ReturnTo: returnPath(c.Query("return_to"))})
	if err != nil {
		return err
	}
	http.SetCookie(c.Writer, &http.Cookie{Name: oidcStateCookie, Value: flow.State, Path: "/", HttpOnly: true,
		Secure: a.secure || c.Request.TLS != nil, SameSite: http.SameSiteLaxMode, MaxAge: int(store.OIDCFlowLifetime / time.Second)})
	c.Redirect(http.StatusFound, target)
	return nil
}

func providerUnavailable() *pageError {
	return &pageError{status: http.StatusBadGateway, title: "The identity provider is unavailable",
		message: "The console could not reach the identity provider, so single sign-on does not work right now. " +
			"Try again in a moment; an administrator with a break-glass account can still sign in with a password."}
}

// returnPath keeps a return_to that is a path on this console, and "/"
// otherwise: a sign-in never ends on another site.
func returnPath(s string) string {
	if !strings.HasPrefix(s, "/") || strings.HasPrefix(s, "//") || strings.HasPrefix(s, "/\\") || len(s) > 512 ||
		strings.ContainsAny(s, "\r\n\t\\") {
		return "/"
	}
	return s
}

// oidcCallback completes a sign-in: the state must match the browser's
// cookie and a flow not used before; the provider's code is redeemed with
// the flow's PKCE verifier; the ID token is verified; the person's groups
// give their role; their user is created or updated and a session starts,
// as a password sign-in's does.
func (a *API) oidcCallback(c *gin.Context) error {
	if a.sso == nil {
		return ssoNotConfigured()
	}
	http.SetCookie(c.Writer, &http.Cookie{Name: oidcStateCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
		Secure: a.secure || c.Request.TLS != nil, SameSite: http.SameSiteLaxMode})
	state := c.Query("state")
	cookie, _ := c.Cookie(oidcStateCookie)
	if state == "" || cookie == "" || subtle.ConstantTimeCompare([]byte(state), []byte(cookie)) != 1 {
		return &pageError{status: http.StatusBadRequest, title: "Sign-in not recognized",
			message: "This sign-in was not started in this browser, or it was started again in another tab. Start again from the sign-in page."}
	}
	flow, err := a.store.TakeOIDCFlow(c.Request.Context(), state)
	if errors.Is(err, rules.ErrNotFound) {
		return &pageError{status: http.StatusBadRequest, title: "Sign-in link already used",
			message: "This sign-in was already completed or has expired, so it cannot be used again. Start again from the sign-in page."}
	}
	if err != nil {
		return err
	}
	if e := c.Query("error"); e != "" {
		msg := e
		if d := c.Query("error_description"); d != "" {
			msg += ": " + d
		}
		return &pageError{status: http.StatusForbidden, title: "The identity provider did not sign you in",
			message: "The identity provider answered " + sso.Clip(msg, 300) + "."}
	}
	code := c.Query("code")
	if code == "" {
		return &pageError{status: http.StatusBadRequest, title: "Sign-in incomplete", message: "The identity provider sent no sign-in code. Start again."}
	}
	id, err := a.sso.Finish(c.Request.Context(), sso.Flow{State: state, Nonce: flow.Nonce, Verifier: flow.Verifier}, code)
	var (
		ue *sso.UnavailableError
		re *sso.RejectedError
	)
	switch {
	case errors.As(err, &ue):
		a.log.WarnContext(c, "identity provider unavailable", "step", ue.Step, "issuer", a.sso.Issuer(), "error", ue.Err)
		return providerUnavailable()
	case errors.As(err, &re):
		a.log.WarnContext(c, "single sign-on refused", "issuer", a.sso.Issuer(), "ip", c.ClientIP(), "reason", re.Reason)
		return &pageError{status: http.StatusUnauthorized, title: "Sign-in refused", message: re.Reason + "."}
	case err != nil:
		return err
	}
	grant, ok := a.sso.Grant(id)
	if !ok {
		groups := "none"
		if len(id.Groups) > 0 {
			groups = sso.Clip(strings.Join(id.Groups, ", "), 300)
		}
		return &pageError{status: http.StatusForbidden, title: "No access to Sluice",
			message: "You signed in at the identity provider as " + sso.Clip(id.Username(), 64) + ", but none of your groups (" + groups +
				") has a role in this console. Ask an administrator to add one of your groups to the console's role map."}
	}
	u, secret, _, err := a.store.SignInOIDC(c.Request.Context(), store.OIDCIdentity{Issuer: id.Issuer, Subject: id.Subject,
		Username: id.Username(), Role: grant.Role, Domains: grant.Domains}, a.actor(c))
	if errors.Is(err, store.ErrUserDisabled) {
		return &pageError{status: http.StatusForbidden, title: "Account disabled",
			message: "Your Sluice account is disabled. Ask an administrator to enable it."}
	}
	if err != nil {
		return err
	}
	a.log.InfoContext(c, "signed in with oidc", "user", u.Username, "role", grant.Role, "request_id", c.GetString("request_id"))
	a.setSessionCookie(c, secret)
	c.Redirect(http.StatusSeeOther, flow.ReturnTo)
	return nil
}
