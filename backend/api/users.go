package api

import (
	"net/http"
	"regexp"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/backend/store"
)

var usernamePattern = regexp.MustCompile(`^[A-Za-z0-9_.@-]{1,64}$`)

// minPasswordBytes is the shortest password the API accepts (NIST SP
// 800-63B's minimum for user-chosen secrets).
const minPasswordBytes = 8

func checkPassword(p string) error {
	if len(p) < minPasswordBytes || len(p) > store.MaxPasswordBytes {
		return badRequest("a password has %d to %d bytes", minPasswordBytes, store.MaxPasswordBytes)
	}
	return nil
}

func checkRole(role string, node bool) error {
	switch role {
	case store.RoleViewer, store.RoleSupport, store.RoleEditor, store.RoleAdmin:
		return nil
	case store.RoleNode:
		if node {
			return nil
		}
	}
	if node {
		return badRequest("role must be one of viewer, support, editor, admin, node")
	}
	return badRequest("role must be one of viewer, support, editor, admin")
}

func (a *API) listUsers(c *gin.Context) error {
	users, err := a.store.ListUsers(c.Request.Context())
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, gin.H{"users": users})
	return nil
}

type userCreateRequest struct {
	Username string   `json:"username"`
	Password string   `json:"password"`
	Role     string   `json:"role"`
	Domains  []string `json:"domains"` // empty: every domain
}

func (a *API) createUser(c *gin.Context) error {
	var req userCreateRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if !usernamePattern.MatchString(req.Username) {
		return badRequest("usernames use letters, digits, '_', '.', '@', '-' (at most 64)")
	}
	if err := checkRole(req.Role, false); err != nil {
		return err
	}
	if err := checkPassword(req.Password); err != nil {
		return err
	}
	u, err := a.store.CreateGrantedUser(c.Request.Context(), req.Username, req.Password, req.Role, req.Domains, a.actor(c))
	if err != nil {
		return err
	}
	c.JSON(http.StatusCreated, u)
	return nil
}

func (a *API) disableUser(c *gin.Context) error { return a.setUserDisabled(c, true) }

func (a *API) enableUser(c *gin.Context) error { return a.setUserDisabled(c, false) }

// setUserDisabled disables or enables a user; a disabled user's sessions end
// at once. The last enabled admin cannot be disabled.
func (a *API) setUserDisabled(c *gin.Context, disabled bool) error {
	id, err := pathInt(c, "id")
	if err != nil {
		return err
	}
	u, err := a.store.SetUserDisabled(c.Request.Context(), id, disabled, a.actor(c))
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, u)
	return nil
}

type roleRequest struct {
	Role string `json:"role"`
}

func (a *API) setUserRole(c *gin.Context) error {
	id, err := pathInt(c, "id")
	if err != nil {
		return err
	}
	var req roleRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if err := checkRole(req.Role, false); err != nil {
		return err
	}
	u, err := a.store.SetUserRole(c.Request.Context(), id, req.Role, a.actor(c))
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, u)
	return nil
}

type passwordResetRequest struct {
	Password string `json:"password"`
}

// resetPassword is an admin setting a user's password; the user's sessions
// end.
func (a *API) resetPassword(c *gin.Context) error {
	id, err := pathInt(c, "id")
	if err != nil {
		return err
	}
	var req passwordResetRequest
	if err := decodeLimit(c, &req, maxLoginBytes, false); err != nil {
		return err
	}
	if err := checkPassword(req.Password); err != nil {
		return err
	}
	u, err := a.store.ResetPassword(c.Request.Context(), id, req.Password, a.actor(c))
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, u)
	return nil
}

type domainsRequest struct {
	Domains []string `json:"domains"`
}

// setUserDomains changes the domains a user's role holds for ([]: every
// domain).
func (a *API) setUserDomains(c *gin.Context) error {
	id, err := pathInt(c, "id")
	if err != nil {
		return err
	}
	var req domainsRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if req.Domains == nil {
		return badRequest("domains is required ([] for every domain)")
	}
	u, err := a.store.SetUserDomains(c.Request.Context(), id, req.Domains, a.actor(c))
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, u)
	return nil
}
