package api

import (
	"context"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
)

// healthz answers as long as the process serves HTTP.
func healthz(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "ok"}) }

// readyz answers 200 when the database is reachable and migrated, 503
// otherwise.
func (a *API) readyz(c *gin.Context) {
	ctx, cancel := context.WithTimeout(c.Request.Context(), 2*time.Second)
	defer cancel()
	if err := a.store.Ready(ctx); err != nil {
		c.JSON(http.StatusServiceUnavailable, gin.H{"status": "unavailable", "reason": "database not reachable or not migrated"})
		return
	}
	c.JSON(http.StatusOK, gin.H{"status": "ready"})
}
