package api

import (
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
)

func pathInt(c *gin.Context, name string) (int64, error) {
	n, err := strconv.ParseInt(c.Param(name), 10, 64)
	if err != nil || n <= 0 {
		return 0, badRequest("%s must be a positive integer", name)
	}
	return n, nil
}

func queryInt(c *gin.Context, name string) (int64, error) {
	s := c.Query(name)
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, badRequest("query parameter %s must be a non-negative integer", name)
	}
	return n, nil
}

func queryTime(c *gin.Context, name string) (time.Time, error) {
	s := c.Query(name)
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, badRequest("query parameter %s must be an RFC 3339 time like 2025-01-31T12:00:00Z", name)
	}
	return t, nil
}

// page reads the cursor pagination parameters ?cursor= and ?limit=.
func page(c *gin.Context) (cursor int64, limit int, err error) {
	if cursor, err = queryInt(c, "cursor"); err != nil {
		return 0, 0, err
	}
	l, err := queryInt(c, "limit")
	if err != nil {
		return 0, 0, err
	}
	if l > 1000 {
		return 0, 0, badRequest("query parameter limit must be at most 1000")
	}
	return cursor, int(l), nil
}

// nextCursor renders a store's next-page cursor: null on the last page.
func nextCursor(next int64) *string {
	if next == 0 {
		return nil
	}
	s := strconv.FormatInt(next, 10)
	return &s
}

// pathVersion reads a version number; 0 means the empty ruleset before the
// first version.
func pathVersion(c *gin.Context, name string) (int64, error) {
	n, err := strconv.ParseInt(c.Param(name), 10, 64)
	if err != nil || n < 0 {
		return 0, badRequest("%s must be a version number (0 for the empty ruleset)", name)
	}
	return n, nil
}
