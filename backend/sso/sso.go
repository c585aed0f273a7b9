// Package sso signs staff in through an OpenID Connect provider: the
// authorization code flow with PKCE (S256), the ID token's signature,
// issuer, audience, expiry and nonce checked by github.com/coreos/go-oidc,
// and the person's groups turned into a Sluice role by a RoleMap. It is the
// only package that imports go-oidc and golang.org/x/oauth2.
//
// Discovery is lazy: the console starts whether or not the provider
// answers, and each sign-in reads the provider's metadata again, so a
// provider that is down gets a clear answer and one that comes back works
// at once.
package sso

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"
)

// Config is a provider and the console's client registration at it.
type Config struct {
	Issuer       string
	ClientID     string
	ClientSecret string // empty for a public client (PKCE alone)
	RedirectURL  string // the console's callback, as registered at the provider
	// Scopes requested; default openid, profile, email. Some providers
	// release group claims only for a "groups" scope.
	Scopes []string
	// GroupsClaim names the ID token claim holding the person's groups
	// (default "groups"): an array of strings, or one string.
	GroupsClaim string
	RoleMap     RoleMap
	// HTTPClient talks to the provider; nil means a client with a 10 s
	// timeout.
	HTTPClient *http.Client
}

// Check reports the first problem with cfg.
func (cfg Config) Check() error {
	u, err := url.Parse(cfg.Issuer)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return fmt.Errorf("oidc issuer %q: want an http(s) URL", cfg.Issuer)
	}
	if cfg.ClientID == "" {
		return errors.New("oidc: a client ID is needed with an issuer")
	}
	r, err := url.Parse(cfg.RedirectURL)
	if err != nil || (r.Scheme != "https" && r.Scheme != "http") || r.Host == "" {
		return fmt.Errorf("oidc redirect URL %q: want the absolute http(s) URL of /api/v1/auth/oidc/callback as the provider redirects to it", cfg.RedirectURL)
	}
	if cfg.RoleMap.Empty() {
		return errors.New("oidc: a role map is needed; without one nobody who signs in gets a role")
	}
	return nil
}

// Provider is a configured OpenID provider, discovered on first use.
type Provider struct {
	cfg    Config
	client *http.Client

	mu       sync.Mutex
	provider *oidc.Provider // nil until discovery succeeds
}

// New returns a Provider for cfg (see Config.Check); it does not contact
// the provider.
func New(cfg Config) (*Provider, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	if len(cfg.Scopes) == 0 {
		cfg.Scopes = []string{oidc.ScopeOpenID, "profile", "email"}
	} else if !containsScope(cfg.Scopes, oidc.ScopeOpenID) {
		cfg.Scopes = append([]string{oidc.ScopeOpenID}, cfg.Scopes...)
	}
	if cfg.GroupsClaim == "" {
		cfg.GroupsClaim = "groups"
	}
	client := cfg.HTTPClient
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Second}
	}
	return &Provider{cfg: cfg, client: client}, nil
}

func containsScope(scopes []string, s string) bool {
	for _, x := range scopes {
		if x == s {
			return true
		}
	}
	return false
}

// Issuer returns the configured issuer URL.
func (p *Provider) Issuer() string { return p.cfg.Issuer }

// UnavailableError reports that the provider could not be reached or
// answered wrongly; Err is for logs, not for people.
type UnavailableError struct {
	Step string // "discovery" or "token exchange"
	Err  error
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("identity provider %s: %v", e.Step, e.Err)
}

func (e *UnavailableError) Unwrap() error { return e.Err }

// discover returns the provider's metadata, fetching it if no earlier
// attempt succeeded (or always, with fresh).
func (p *Provider) discover(ctx context.Context, fresh bool) (*oidc.Provider, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.provider != nil && !fresh {
		return p.provider, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// The provider keeps the client (not ctx) for its later key fetches.
	op, err := oidc.NewProvider(oidc.ClientContext(ctx, p.client), p.cfg.Issuer)
	if err != nil {
		return nil, &UnavailableError{Step: "discovery", Err: err}
	}
	p.provider = op
	return op, nil
}

// Discover fetches the provider's metadata now, if no earlier attempt
// succeeded, and reports whether it could.
func (p *Provider) Discover(ctx context.Context) error {
	_, err := p.discover(ctx, false)
	return err
}

func (p *Provider) oauth2(op *oidc.Provider) *oauth2.Config {
	return &oauth2.Config{ClientID: p.cfg.ClientID, ClientSecret: p.cfg.ClientSecret, RedirectURL: p.cfg.RedirectURL,
		Endpoint: op.Endpoint(), Scopes: p.cfg.Scopes}
}

// Flow is what a sign-in must remember between the redirect to the
// provider and the callback: the state (in the browser's cookie and the
// redirect), the nonce the ID token must carry and the PKCE verifier.
type Flow struct {
	State    string
	Nonce    string
	Verifier string
}

// Start begins a sign-in: it returns the flow's secrets and the provider
// URL to send the browser to. It reads the provider's metadata afresh each
// time, so that a provider that went down since gets *UnavailableError
// (and the person a page saying so) rather than a browser sent to a dead
// address; it also picks up changed endpoints. Sign-ins are rare: one
// small request each.
func (p *Provider) Start(ctx context.Context) (Flow, string, error) {
	op, err := p.discover(ctx, true)
	if err != nil {
		return Flow{}, "", err
	}
	f := Flow{State: random(), Nonce: random(), Verifier: oauth2.GenerateVerifier()}
	u := p.oauth2(op).AuthCodeURL(f.State, oidc.Nonce(f.Nonce), oauth2.S256ChallengeOption(f.Verifier))
	return f, u, nil
}

func random() string {
	b := make([]byte, 32)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// Identity is who the provider signed in.
type Identity struct {
	Issuer            string
	Subject           string
	PreferredUsername string
	Email             string
	Groups            []string
}

// RejectedError is an ID token or token answer that failed a check; its
// message is safe to show.
type RejectedError struct{ Reason string }

func (e *RejectedError) Error() string { return e.Reason }

// Finish completes a sign-in: it redeems code with the flow's PKCE
// verifier and verifies the ID token: signature against the provider's
// published keys, issuer, audience including the client ID, an authorized
// party (azp), if any, that is the client, expiry, and the flow's nonce.
// It fails with *UnavailableError when the provider cannot be
// reached and *RejectedError when the provider refuses the code or the
// token fails a check.
func (p *Provider) Finish(ctx context.Context, f Flow, code string) (Identity, error) {
	op, err := p.discover(ctx, false)
	if err != nil {
		return Identity{}, err
	}
	ctx = oidc.ClientContext(ctx, p.client)
	tok, err := p.oauth2(op).Exchange(ctx, code, oauth2.VerifierOption(f.Verifier))
	if err != nil {
		var re *oauth2.RetrieveError
		if errors.As(err, &re) {
			return Identity{}, &RejectedError{Reason: "the identity provider refused the sign-in code (" + oauthErrorText(re) + ")"}
		}
		return Identity{}, &UnavailableError{Step: "token exchange", Err: err}
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		return Identity{}, &RejectedError{Reason: "the identity provider sent no ID token"}
	}
	idt, err := op.Verifier(&oidc.Config{ClientID: p.cfg.ClientID}).Verify(ctx, raw)
	if err != nil {
		return Identity{}, &RejectedError{Reason: "the ID token is not valid: " + verifyReason(err)}
	}
	var azp struct {
		AuthorizedParty string `json:"azp"`
	}
	if err := idt.Claims(&azp); err != nil {
		return Identity{}, &RejectedError{Reason: "the ID token's claims cannot be read"}
	}
	if azp.AuthorizedParty != "" && azp.AuthorizedParty != p.cfg.ClientID {
		// OpenID Connect Core 3.1.3.7: a token shared among audiences
		// must have been requested by this client.
		return Identity{}, &RejectedError{Reason: fmt.Sprintf("the ID token was issued to another client (authorized party %q)", Clip(azp.AuthorizedParty, 100))}
	}
	if idt.Nonce != f.Nonce {
		return Identity{}, &RejectedError{Reason: "the ID token was not issued for this sign-in (nonce mismatch): it may be replayed"}
	}
	var claims map[string]any
	if err := idt.Claims(&claims); err != nil {
		return Identity{}, &RejectedError{Reason: "the ID token's claims cannot be read"}
	}
	id := Identity{Issuer: idt.Issuer, Subject: idt.Subject}
	id.PreferredUsername, _ = claims["preferred_username"].(string)
	id.Email, _ = claims["email"].(string)
	switch g := claims[p.cfg.GroupsClaim].(type) {
	case string:
		id.Groups = []string{g}
	case []any:
		for _, v := range g {
			if s, ok := v.(string); ok {
				id.Groups = append(id.Groups, s)
			}
		}
	}
	return id, nil
}

// oauthErrorText is the provider's error code and description, cut short.
func oauthErrorText(re *oauth2.RetrieveError) string {
	s := re.ErrorCode
	if s == "" {
		s = fmt.Sprintf("HTTP %d", re.Response.StatusCode)
	}
	if re.ErrorDescription != "" {
		s += ": " + re.ErrorDescription
	}
	return Clip(s, 200)
}

// verifyReason says which check an ID token failed: go-oidc's own words
// (which name the expected and the found audience or issuer, or the
// signature), except for expiry, which has its own type.
func verifyReason(err error) string {
	var exp *oidc.TokenExpiredError
	if errors.As(err, &exp) {
		return "it expired at " + exp.Expiry.UTC().Format(time.RFC3339)
	}
	return Clip(strings.TrimPrefix(err.Error(), "oidc: "), 300)
}

// Clip cuts s to at most n bytes of printable text.
func Clip(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return -1
		}
		return r
	}, strings.ToValidUTF8(s, ""))
	if len(s) > n {
		s = strings.ToValidUTF8(s[:n], "") + "…"
	}
	return s
}

// Grant is the role map's grant for id (false: none of id's groups has a
// role).
func (p *Provider) Grant(id Identity) (Grant, bool) { return p.cfg.RoleMap.Grant(id.Groups) }

// usernameChars is what a Sluice username may not contain.
var usernameChars = regexp.MustCompile(`[^A-Za-z0-9_.@-]+`)

// Username is the name to give id's user on their first sign-in: the
// provider's preferred_username, else the email, else "sso-" and the
// subject, in the username alphabet and at most 64 bytes.
func (id Identity) Username() string {
	candidates := []string{id.PreferredUsername, id.Email}
	if id.Subject != "" {
		candidates = append(candidates, "sso-"+id.Subject)
	}
	for _, c := range candidates {
		name := strings.Trim(usernameChars.ReplaceAllString(c, "-"), "-")
		if len(name) > 64 {
			name = name[:64]
		}
		if name != "" && name != "sso" {
			return name
		}
	}
	return "sso-user"
}
