// Package oidcop is an OpenID provider for tests: zitadel/oidc's certified
// op package (discovery, authorization with PKCE, token, keys and userinfo
// endpoints, signed ID tokens) over real HTTP, with an in-memory storage,
// a plain username/password login page and a few deliberate faults
// (Faults) for the checks a relying party must make. It is never part of
// the sluice binary.
package oidcop

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
	"golang.org/x/text/language"
)

// User is an account at the provider.
type User struct {
	Subject  string
	Username string // preferred_username, and the login page's username
	Password string
	Email    string
	Groups   []string // the "groups" claim
}

// Client is a relying party registered at the provider (a confidential web
// client: client_secret_basic, authorization code, PKCE S256).
type Client struct {
	ID           string
	Secret       string
	RedirectURIs []string
}

// Faults make the provider misbehave the way a forged or stale token
// would look to the relying party.
type Faults struct {
	// WrongKey signs ID tokens with a key the provider does not publish.
	WrongKey bool
	// Audience, when set, is the client another ID token is issued for: the
	// provider signs it as usual and answers with it instead of the
	// client's own (a token meant for another application).
	Audience string
	// SharedAudience, with Audience, also lists the client among that
	// token's audiences; its authorized party (azp) stays the other client.
	SharedAudience bool
	// IDTokenLifetime, when not zero, replaces the 5-minute lifetime; a
	// negative one issues tokens that have already expired.
	IDTokenLifetime time.Duration
	// ReplayIDToken answers token requests with the ID token of the
	// previous successful exchange instead of a new one.
	ReplayIDToken bool
}

// Server is a running provider.
type Server struct {
	// Issuer is the provider's issuer URL (http://127.0.0.1:PORT).
	Issuer string

	srv     *http.Server
	ln      net.Listener
	storage *storage
}

// Start runs a provider on addr ("127.0.0.1:0" for any free port) until
// Close.
func Start(addr string, clients []Client, users []User) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("oidcop: listen: %w", err)
	}
	issuer := "http://" + ln.Addr().String()
	st, err := newStorage(clients, users)
	if err != nil {
		ln.Close()
		return nil, err
	}
	provider, err := op.NewProvider(&op.Config{
		CryptoKey:          sha256.Sum256([]byte(issuer)),
		CodeMethodS256:     true,
		AuthMethodPost:     true,
		SupportedUILocales: []language.Tag{language.English},
	}, st, op.StaticIssuer(issuer), op.WithAllowInsecure())
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("oidcop: %w", err)
	}
	callback := op.AuthCallbackURL(provider)
	interceptor := op.NewIssuerInterceptor(provider.IssuerFromRequest)
	mux := http.NewServeMux()
	mux.Handle("/login", interceptor.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st.login(w, r, callback)
	}))
	mux.Handle("/oauth/token", st.tokenFaults(issuer, provider))
	mux.Handle("/", provider)
	s := &Server{Issuer: issuer, ln: ln, storage: st,
		srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}}
	go s.srv.Serve(ln)
	return s, nil
}

// Close stops the provider and closes its connections.
func (s *Server) Close() error { return s.srv.Close() }

// SetGroups replaces a user's groups (from the next sign-in on).
func (s *Server) SetGroups(username string, groups []string) error {
	s.storage.mu.Lock()
	defer s.storage.mu.Unlock()
	for _, u := range s.storage.users {
		if u.Username == username {
			u.Groups = append([]string(nil), groups...)
			return nil
		}
	}
	return fmt.Errorf("oidcop: no user %q", username)
}

// SetFaults sets how the provider misbehaves from now on.
func (s *Server) SetFaults(f Faults) {
	s.storage.mu.Lock()
	defer s.storage.mu.Unlock()
	s.storage.faults = f
}

type key struct {
	id  string
	key *rsa.PrivateKey
}

func (k *key) SignatureAlgorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k *key) Key() any                                    { return k.key }
func (k *key) ID() string                                  { return k.id }

type publicKey struct{ *key }

func (k publicKey) Algorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k publicKey) Use() string                        { return "sig" }
func (k publicKey) Key() any                           { return &k.key.key.PublicKey }

type storage struct {
	mu        sync.Mutex
	clients   map[string]*client
	users     map[string]*User // by subject
	requests  map[string]*authRequest
	codes     map[string]string // code → request ID
	tokens    map[string]accessToken
	signing   *key
	forged    *key // same key ID, not published
	faults    Faults
	lastToken string // the last ID token issued, for ReplayIDToken
}

type accessToken struct {
	subject, clientID string
	scopes            []string
	expires           time.Time
}

func newStorage(clients []Client, users []User) (*storage, error) {
	genuine, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	forged, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	s := &storage{clients: map[string]*client{}, users: map[string]*User{}, requests: map[string]*authRequest{},
		codes: map[string]string{}, tokens: map[string]accessToken{},
		signing: &key{id: "key-1", key: genuine}, forged: &key{id: "key-1", key: forged}}
	for _, c := range clients {
		s.clients[c.ID] = &client{Client: c, storage: s}
	}
	for _, u := range users {
		u.Groups = append([]string(nil), u.Groups...)
		s.users[u.Subject] = &u
	}
	return s, nil
}

func randomID() string {
	b := make([]byte, 16)
	rand.Read(b)
	return fmt.Sprintf("%x", b)
}

var loginPage = template.Must(template.New("login").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Test identity provider</title></head>
<body><main><h1>Test identity provider</h1>
{{if .Error}}<p role="alert">{{.Error}}</p>{{end}}
<form method="post" action="/login">
<input type="hidden" name="id" value="{{.ID}}">
<label>Username <input name="username" autocomplete="username"></label>
<label>Password <input name="password" type="password" autocomplete="current-password"></label>
<button type="submit">Sign in at the provider</button>
</form></main></body></html>
`))

// login is the provider's own sign-in page: GET shows the form, POST
// checks the password and sends the browser back to the authorization
// endpoint's callback, which redirects to the client with a code.
func (s *storage) login(w http.ResponseWriter, r *http.Request, callback func(context.Context, string) string) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, "bad form", http.StatusBadRequest)
		return
	}
	id := r.FormValue("authRequestID")
	if r.Method == http.MethodPost {
		id = r.FormValue("id")
		if err := s.checkPassword(id, r.FormValue("username"), r.FormValue("password")); err != nil {
			w.WriteHeader(http.StatusUnauthorized)
			loginPage.Execute(w, map[string]string{"ID": id, "Error": err.Error()})
			return
		}
		http.Redirect(w, r, callback(r.Context(), id), http.StatusFound)
		return
	}
	loginPage.Execute(w, map[string]string{"ID": id})
}

func (s *storage) checkPassword(requestID, username, password string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	req, ok := s.requests[requestID]
	if !ok {
		return errors.New("unknown sign-in request")
	}
	for _, u := range s.users {
		if u.Username == username && u.Password == password {
			req.subject, req.done, req.authTime = u.Subject, true, time.Now()
			return nil
		}
	}
	return errors.New("wrong username or password")
}

// tokenFaults serves the token endpoint, remembering each ID token issued
// and, as Faults say, answering with the previous one or with one issued
// for another client.
func (s *storage) tokenFaults(issuer string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		form, _ := io.ReadAll(io.LimitReader(r.Body, 64<<10))
		r.Body = io.NopCloser(bytes.NewReader(form))
		values, _ := url.ParseQuery(string(form))
		s.mu.Lock()
		faults := s.faults
		var other *authRequest
		if id, ok := s.codes[values.Get("code")]; ok && faults.Audience != "" {
			if ar, ok := s.requests[id]; ok {
				cp := *ar
				cp.clientID = faults.Audience
				if faults.SharedAudience {
					cp.audience = []string{ar.clientID}
				}
				other = &cp
			}
		}
		s.mu.Unlock()

		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r)
		body := rec.Body.Bytes()
		var answer map[string]any
		if rec.Code == http.StatusOK && json.Unmarshal(body, &answer) == nil {
			if fresh, ok := answer["id_token"].(string); ok {
				s.mu.Lock()
				last := s.lastToken
				s.lastToken = fresh
				s.mu.Unlock()
				switch {
				case faults.ReplayIDToken && last != "":
					answer["id_token"] = last
				case other != nil:
					c := &client{Client: Client{ID: faults.Audience}, storage: s}
					tok, err := op.CreateIDToken(r.Context(), issuer, other, c.IDTokenLifetime(), "", "", s, c)
					if err != nil {
						http.Error(w, err.Error(), http.StatusInternalServerError)
						return
					}
					answer["id_token"] = tok
				}
				body, _ = json.Marshal(answer)
			}
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.Header().Del("Content-Length")
		w.WriteHeader(rec.Code)
		w.Write(body)
	})
}

// CreateAuthRequest implements op.Storage. Like a strict provider, it
// requires PKCE with S256 and a nonce, so a client that sends neither is
// refused here rather than trusted.
func (s *storage) CreateAuthRequest(_ context.Context, req *oidc.AuthRequest, _ string) (op.AuthRequest, error) {
	if req.CodeChallenge == "" || req.CodeChallengeMethod != oidc.CodeChallengeMethodS256 {
		return nil, oidc.ErrInvalidRequest().WithDescription("PKCE with S256 is required")
	}
	if req.Nonce == "" {
		return nil, oidc.ErrInvalidRequest().WithDescription("a nonce is required")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ar := &authRequest{id: randomID(), storage: s, clientID: req.ClientID, redirectURI: req.RedirectURI, state: req.State,
		nonce: req.Nonce, scopes: req.Scopes, responseType: req.ResponseType, responseMode: req.ResponseMode}
	if req.CodeChallenge != "" {
		ar.challenge = &oidc.CodeChallenge{Challenge: req.CodeChallenge, Method: req.CodeChallengeMethod}
	}
	s.requests[ar.id] = ar
	return ar, nil
}

// AuthRequestByID implements op.Storage.
func (s *storage) AuthRequestByID(_ context.Context, id string) (op.AuthRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ar, ok := s.requests[id]; ok {
		return ar, nil
	}
	return nil, errors.New("auth request not found")
}

// AuthRequestByCode implements op.Storage.
func (s *storage) AuthRequestByCode(ctx context.Context, code string) (op.AuthRequest, error) {
	s.mu.Lock()
	id, ok := s.codes[code]
	s.mu.Unlock()
	if !ok {
		return nil, errors.New("code invalid or already used")
	}
	return s.AuthRequestByID(ctx, id)
}

// SaveAuthCode implements op.Storage.
func (s *storage) SaveAuthCode(_ context.Context, id, code string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.codes[code] = id
	return nil
}

// DeleteAuthRequest implements op.Storage: a code is redeemed once.
func (s *storage) DeleteAuthRequest(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.requests, id)
	for code, rid := range s.codes {
		if rid == id {
			delete(s.codes, code)
		}
	}
	return nil
}

// CreateAccessToken implements op.Storage.
func (s *storage) CreateAccessToken(_ context.Context, req op.TokenRequest) (string, time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, exp := randomID(), time.Now().Add(5*time.Minute)
	clientID := ""
	if ar, ok := req.(*authRequest); ok {
		clientID = ar.clientID
	}
	s.tokens[id] = accessToken{subject: req.GetSubject(), clientID: clientID, scopes: req.GetScopes(), expires: exp}
	return id, exp, nil
}

var errUnsupported = errors.New("not supported by the test provider")

// CreateAccessAndRefreshTokens implements op.Storage; there are no refresh
// tokens here.
func (s *storage) CreateAccessAndRefreshTokens(context.Context, op.TokenRequest, string) (string, string, time.Time, error) {
	return "", "", time.Time{}, errUnsupported
}

// TokenRequestByRefreshToken implements op.Storage.
func (s *storage) TokenRequestByRefreshToken(context.Context, string) (op.RefreshTokenRequest, error) {
	return nil, errUnsupported
}

// TerminateSession implements op.Storage.
func (s *storage) TerminateSession(context.Context, string, string) error { return nil }

// RevokeToken implements op.Storage.
func (s *storage) RevokeToken(_ context.Context, token, _, _ string) *oidc.Error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.tokens, token)
	return nil
}

// GetRefreshTokenInfo implements op.Storage.
func (s *storage) GetRefreshTokenInfo(context.Context, string, string) (string, string, error) {
	return "", "", op.ErrInvalidRefreshToken
}

// SigningKey implements op.Storage; with Faults.WrongKey it is a key the
// provider does not publish.
func (s *storage) SigningKey(context.Context) (op.SigningKey, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.faults.WrongKey {
		return s.forged, nil
	}
	return s.signing, nil
}

// SignatureAlgorithms implements op.Storage.
func (s *storage) SignatureAlgorithms(context.Context) ([]jose.SignatureAlgorithm, error) {
	return []jose.SignatureAlgorithm{jose.RS256}, nil
}

// KeySet implements op.Storage: only the genuine key is published.
func (s *storage) KeySet(context.Context) ([]op.Key, error) {
	return []op.Key{publicKey{s.signing}}, nil
}

// GetClientByClientID implements op.Storage.
func (s *storage) GetClientByClientID(_ context.Context, id string) (op.Client, error) {
	if c, ok := s.clients[id]; ok {
		return c, nil
	}
	return nil, errors.New("client not found")
}

// AuthorizeClientIDSecret implements op.Storage.
func (s *storage) AuthorizeClientIDSecret(_ context.Context, id, secret string) error {
	c, ok := s.clients[id]
	if !ok || c.Secret != secret {
		return errors.New("wrong client ID or secret")
	}
	return nil
}

// SetUserinfoFromScopes implements op.Storage; the ID token carries these
// claims too (the client asserts userinfo claims in it).
func (s *storage) SetUserinfoFromScopes(_ context.Context, info *oidc.UserInfo, subject, _ string, scopes []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	u, ok := s.users[subject]
	if !ok {
		return errors.New("user not found")
	}
	info.Subject = u.Subject
	for _, sc := range scopes {
		switch sc {
		case oidc.ScopeProfile:
			info.PreferredUsername = u.Username
			info.Name = u.Username
		case oidc.ScopeEmail:
			info.Email = u.Email
			info.EmailVerified = true
		}
	}
	info.AppendClaims("groups", append([]string{}, u.Groups...))
	return nil
}

// SetUserinfoFromToken implements op.Storage (the userinfo endpoint).
func (s *storage) SetUserinfoFromToken(ctx context.Context, info *oidc.UserInfo, tokenID, _, _ string) error {
	s.mu.Lock()
	t, ok := s.tokens[tokenID]
	s.mu.Unlock()
	if !ok || time.Now().After(t.expires) {
		return errors.New("token invalid or expired")
	}
	return s.SetUserinfoFromScopes(ctx, info, t.subject, t.clientID, t.scopes)
}

// SetIntrospectionFromToken implements op.Storage.
func (s *storage) SetIntrospectionFromToken(context.Context, *oidc.IntrospectionResponse, string, string, string) error {
	return errUnsupported
}

// GetPrivateClaimsFromScopes implements op.Storage.
func (s *storage) GetPrivateClaimsFromScopes(context.Context, string, string, []string) (map[string]any, error) {
	return nil, nil
}

// GetKeyByIDAndClientID implements op.Storage.
func (s *storage) GetKeyByIDAndClientID(context.Context, string, string) (*jose.JSONWebKey, error) {
	return nil, errUnsupported
}

// ValidateJWTProfileScopes implements op.Storage.
func (s *storage) ValidateJWTProfileScopes(context.Context, string, []string) ([]string, error) {
	return nil, errUnsupported
}

// Health implements op.Storage.
func (s *storage) Health(context.Context) error { return nil }

type authRequest struct {
	storage      *storage
	id           string
	clientID     string
	redirectURI  string
	state, nonce string
	scopes       []string
	responseType oidc.ResponseType
	responseMode oidc.ResponseMode
	challenge    *oidc.CodeChallenge
	audience     []string // besides the client
	subject      string
	done         bool
	authTime     time.Time
}

func (a *authRequest) GetID() string                         { return a.id }
func (a *authRequest) GetACR() string                        { return "" }
func (a *authRequest) GetAMR() []string                      { return []string{"pwd"} }
func (a *authRequest) GetAuthTime() time.Time                { return a.authTime }
func (a *authRequest) GetClientID() string                   { return a.clientID }
func (a *authRequest) GetCodeChallenge() *oidc.CodeChallenge { return a.challenge }
func (a *authRequest) GetNonce() string                      { return a.nonce }
func (a *authRequest) GetRedirectURI() string                { return a.redirectURI }
func (a *authRequest) GetResponseType() oidc.ResponseType    { return a.responseType }
func (a *authRequest) GetResponseMode() oidc.ResponseMode    { return a.responseMode }
func (a *authRequest) GetScopes() []string                   { return a.scopes }
func (a *authRequest) GetState() string                      { return a.state }
func (a *authRequest) GetSubject() string                    { return a.subject }
func (a *authRequest) Done() bool                            { return a.done }

// GetAudience is the client and any other audience.
func (a *authRequest) GetAudience() []string { return append([]string{a.clientID}, a.audience...) }

type client struct {
	Client
	storage *storage
}

func (c *client) GetID() string                       { return c.ID }
func (c *client) RedirectURIs() []string              { return c.Client.RedirectURIs }
func (c *client) PostLogoutRedirectURIs() []string    { return nil }
func (c *client) ApplicationType() op.ApplicationType { return op.ApplicationTypeWeb }
func (c *client) AuthMethod() oidc.AuthMethod         { return oidc.AuthMethodBasic }
func (c *client) ResponseTypes() []oidc.ResponseType {
	return []oidc.ResponseType{oidc.ResponseTypeCode}
}
func (c *client) GrantTypes() []oidc.GrantType         { return []oidc.GrantType{oidc.GrantTypeCode} }
func (c *client) LoginURL(id string) string            { return "/login?authRequestID=" + id }
func (c *client) AccessTokenType() op.AccessTokenType  { return op.AccessTokenTypeBearer }
func (c *client) DevMode() bool                        { return true } // http redirect URIs on 127.0.0.1
func (c *client) IsScopeAllowed(string) bool           { return false }
func (c *client) IDTokenUserinfoClaimsAssertion() bool { return true }
func (c *client) ClockSkew() time.Duration             { return 0 }
func (c *client) RestrictAdditionalIdTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}
func (c *client) RestrictAdditionalAccessTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}

// IDTokenLifetime is 5 minutes, or Faults.IDTokenLifetime.
func (c *client) IDTokenLifetime() time.Duration {
	c.storage.mu.Lock()
	defer c.storage.mu.Unlock()
	if c.storage.faults.IDTokenLifetime != 0 {
		return c.storage.faults.IDTokenLifetime
	}
	return 5 * time.Minute
}

// String keeps a client's secret out of logs.
func (c *client) String() string { return "client " + c.ID }

var _ op.Storage = (*storage)(nil)
