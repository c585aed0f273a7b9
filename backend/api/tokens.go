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
	Name      string `json:"name"`
	Role      string `json:"role"`
	ExpiresIn string `json:"expires_in"` // Go duration, e.g. "720h"; empty = never
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
	tok, secret, err := a.store.CreateToken(c.Request.Context(), req.Name, req.Role, expires, a.actor(c))
	if err != nil {
		return err
	}
	c.JSON(http.StatusCreated, tokenSecret(tok, secret))
	return nil
}

// tokenSecret is the answer that shows a token's secret, once.
func tokenSecret(t store.Token, secret string) gin.H {
	return gin.H{"id": t.ID, "token": secret, "name": t.Name, "role": t.Role, "last4": t.Last4, "expires_at": t.ExpiresAt}
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
