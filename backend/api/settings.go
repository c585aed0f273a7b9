package api

import (
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/backend/store"
)

func (a *API) getSettings(c *gin.Context) error {
	s, err := a.store.FindSettings(c.Request.Context())
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, s)
	return nil
}

type settingsRequest struct {
	RequireApproval *bool `json:"require_approval"`
}

func (a *API) putSettings(c *gin.Context) error {
	var req settingsRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if req.RequireApproval == nil {
		return badRequest("require_approval is required")
	}
	s, err := a.store.UpdateSettings(c.Request.Context(), store.SettingsUpdate{RequireApproval: req.RequireApproval}, a.actor(c))
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, s)
	return nil
}
