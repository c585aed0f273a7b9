// Package ginlimit adapts a middleware.Limiter to gin. It is a package of
// its own so that net/http users of the middleware do not import gin.
package ginlimit

import (
	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/enforcer/middleware"
)

// Handler returns gin middleware that checks each request with l: it lets
// the request continue with rate-limit headers set, or aborts it after l
// has written the rejection.
func Handler(l *middleware.Limiter) gin.HandlerFunc {
	return func(c *gin.Context) {
		if !l.Allow(c.Writer, c.Request) {
			c.Abort()
			return
		}
		c.Next()
	}
}
