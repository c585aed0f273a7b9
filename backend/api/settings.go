package api

import (
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/backend/store"
)

func (a *API) getSettings(c *gin.Context) {
	s, err := a.store.FindSettings(c.Request.Context())
	if err != nil {
		a.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, s)
}

type settingsRequest struct {
	RequireApproval *bool `json:"require_approval"`
}

func (a *API) putSettings(c *gin.Context) {
	var req settingsRequest
	if err := decode(c, &req); err != nil {
		a.fail(c, err)
		return
	}
	if req.RequireApproval == nil {
		a.fail(c, badRequest("require_approval is required"))
		return
	}
	s, err := a.store.UpdateSettings(c.Request.Context(), store.SettingsUpdate{RequireApproval: req.RequireApproval}, a.actor(c))
	if err != nil {
		a.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, s)
}
