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
	RequireApproval  *bool `json:"require_approval"`
	SessionIdleS     *int  `json:"session_idle_s"`
	SessionAbsoluteS *int  `json:"session_absolute_s"`
}

func (a *API) putSettings(c *gin.Context) error {
	var req settingsRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if req.RequireApproval == nil && req.SessionIdleS == nil && req.SessionAbsoluteS == nil {
		return badRequest("give require_approval, session_idle_s or session_absolute_s")
	}
	s, err := a.store.UpdateSettings(c.Request.Context(), store.SettingsUpdate{RequireApproval: req.RequireApproval,
		SessionIdleS: req.SessionIdleS, SessionAbsoluteS: req.SessionAbsoluteS}, a.actor(c))
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, s)
	return nil
}
