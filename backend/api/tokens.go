package api

import (
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/backend/store"
)

func (a *API) listTokens(c *gin.Context) error {
	tokens, err := a.store.ListTokens(c.Request.Context())
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, gin.H{"tokens": tokens})
	return nil
}

type tokenRequest struct {
	Name      string   `json:"name"`
	Role      string   `json:"role"`
	ExpiresIn string   `json:"expires_in"` // Go duration, e.g. "720h"; empty = never
	Domains   []string `json:"domains"`    // empty: every domain the caller holds
	ReadOnly  bool     `json:"read_only"`
	Fleet     bool     `json:"fleet"` // node tokens: any node id may connect
}

func (a *API) createToken(c *gin.Context) error {
	var req tokenRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	req.Name = strings.TrimSpace(req.Name)
	if req.Name == "" || len(req.Name) > 128 {
		return badRequest("name is required (at most 128 characters)")
	}
	if err := checkRole(req.Role, true); err != nil {
		return err
	}
	var expires *time.Time
	if req.ExpiresIn != "" {
		d, err := time.ParseDuration(req.ExpiresIn)
		if err != nil || d <= 0 {
			return badRequest("expires_in must be a positive duration such as \"720h\"")
		}
		t := time.Now().Add(d).UTC()
		expires = &t
	}
	spec := store.TokenSpec{Name: req.Name, Role: req.Role, ExpiresAt: expires, Domains: req.Domains, ReadOnly: req.ReadOnly, Fleet: req.Fleet}
	if err := noWider(caller(c), &spec); err != nil {
		return err
	}
	tok, secret, err := a.store.CreateScopedToken(c.Request.Context(), spec, a.actor(c))
	if err != nil {
		return err
	}
	c.JSON(http.StatusCreated, tokenSecret(tok, secret))
	return nil
}

// noWider refuses a token wider than its minter p: a higher role, a
// domain p does not hold, or (when p is a token that expires) a later
// expiry. A minter of some domains who names none gets their own; a minter
// whose token expires gives the new token its expiry when none is asked.
func noWider(p *principal, spec *store.TokenSpec) error {
	if spec.Role != store.RoleNode && roleRank[spec.Role] > roleRank[p.role] {
		return httpError(http.StatusForbidden, "too_wide", "a token never holds more than its creator: your role is "+p.role)
	}
	if spec.Role != store.RoleNode && !p.scope.All {
		if len(spec.Domains) == 0 {
			spec.Domains = p.scope.Domains
			if len(spec.Domains) == 0 {
				return httpError(http.StatusForbidden, "too_wide", "your role holds for no domain: there is nothing to grant")
			}
		}
		if !store.ScopeOf(spec.Domains).Within(p.scope) {
			return httpError(http.StatusForbidden, "too_wide", "a token never holds more than its creator: you hold "+p.scope.String())
		}
	}
	if p.expiresAt != nil {
		if spec.ExpiresAt == nil {
			spec.ExpiresAt = p.expiresAt
		} else if spec.ExpiresAt.After(*p.expiresAt) {
			return httpError(http.StatusForbidden, "too_wide", "a token never outlives the token that creates it: it expires at "+p.expiresAt.UTC().Format(time.RFC3339))
		}
	}
	return nil
}

// tokenSecret is the answer that shows a token's secret, once.
func tokenSecret(t store.Token, secret string) gin.H {
	return gin.H{"id": t.ID, "token": secret, "name": t.Name, "role": t.Role, "last4": t.Last4, "expires_at": t.ExpiresAt,
		"domains": t.Domains, "read_only": t.ReadOnly, "fleet": t.Fleet, "effective_role": t.EffectiveRole}
}

func (a *API) disableToken(c *gin.Context) error {
	id, err := pathInt(c, "id")
	if err != nil {
		return err
	}
	tok, err := a.store.DisableToken(c.Request.Context(), id, a.actor(c))
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, tok)
	return nil
}

// rotateToken gives a token a new secret, shown once; the old one stops
// working at once.
func (a *API) rotateToken(c *gin.Context) error {
	id, err := pathInt(c, "id")
	if err != nil {
		return err
	}
	tok, secret, err := a.store.RotateToken(c.Request.Context(), id, a.actor(c))
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, tokenSecret(tok, secret))
	return nil
}

type tokenOwnerRequest struct {
	Owner string `json:"owner"`
}

// setTokenOwner hands a token to another user, who answers for it from now
// on (store.TransferToken).
func (a *API) setTokenOwner(c *gin.Context) error {
	id, err := pathInt(c, "id")
	if err != nil {
		return err
	}
	var req tokenOwnerRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if !usernamePattern.MatchString(req.Owner) {
		return badRequest("owner must be a username")
	}
	tok, err := a.store.TransferToken(c.Request.Context(), id, req.Owner, a.actor(c))
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, tok)
	return nil
}
