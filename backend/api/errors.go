package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules"
)

// apiError is an error with a status and a message that is safe to show.
type apiError struct {
	status  int
	code    string
	message string
	details any
}

func (e *apiError) Error() string { return e.message }

// httpError is an error answered with status, code and message as given.
func httpError(status int, code, message string) *apiError {
	return &apiError{status: status, code: code, message: message}
}

// badRequest is a 400 with a formatted message.
func badRequest(format string, args ...any) *apiError {
	return httpError(http.StatusBadRequest, "bad_request", fmt.Sprintf(format, args...))
}

// errorBody is the JSON of every error answer: {"error": {code, message, details}}.
func errorBody(code, message string, details any) gin.H {
	body := gin.H{"code": code, "message": message}
	if details != nil {
		body["details"] = details
	}
	return gin.H{"error": body}
}

// fail maps an error to its HTTP answer, in this one place. Errors it does
// not know become a 500 without their text.
func (a *API) fail(c *gin.Context, err error) {
	var (
		ae  *apiError
		ve  *rules.ValidationError
		ce  *store.ConflictError
		ie  *store.InvalidError
		re  *store.RefusedError
		te  *store.SnapshotTooLargeError
		ue  *store.UnprocessableError
		big *http.MaxBytesError
	)
	switch {
	case errors.As(err, &ae):
		c.AbortWithStatusJSON(ae.status, errorBody(ae.code, ae.message, ae.details))
	case errors.As(err, &ve):
		c.AbortWithStatusJSON(http.StatusUnprocessableEntity, errorBody("invalid", "the rules are not valid", ve.Details()))
	case errors.As(err, &ce):
		c.AbortWithStatusJSON(http.StatusConflict, errorBody("conflict", ce.Error(), gin.H{"changed_in": ce.ChangedIn, "base_version": ce.Base}))
	case errors.As(err, &ie):
		c.AbortWithStatusJSON(http.StatusBadRequest, errorBody("bad_request", ie.Reason, nil))
	case errors.As(err, &te):
		c.AbortWithStatusJSON(http.StatusUnprocessableEntity, errorBody("snapshot_too_large", te.Error(),
			gin.H{"bytes": te.Bytes, "max_bytes": te.Max}))
	case errors.As(err, &ue):
		c.AbortWithStatusJSON(http.StatusUnprocessableEntity, errorBody("unprocessable", ue.Reason, nil))
	case errors.As(err, &re):
		c.AbortWithStatusJSON(http.StatusConflict, errorBody("conflict", re.Reason, nil))
	case errors.Is(err, store.ErrPasswordsBusy):
		// Password checks are bounded so that a sign-in flood slows sign-in,
		// not the console: try again in a moment.
		c.Header("Retry-After", "1")
		c.AbortWithStatusJSON(http.StatusServiceUnavailable, errorBody("busy", "too many sign-ins at once; try again in a second", nil))
	case errors.Is(err, store.ErrSelfApproval):
		c.AbortWithStatusJSON(http.StatusForbidden, errorBody("self_approval", "a change needs a second person: its author cannot approve it", nil))
	case errors.Is(err, store.ErrApprovalRequired):
		c.AbortWithStatusJSON(http.StatusConflict, errorBody("approval_required", "changes need approval; propose one with POST /api/v1/changes", nil))
	case errors.Is(err, rules.ErrConflict):
		c.AbortWithStatusJSON(http.StatusConflict, errorBody("conflict", "conflicts with existing data", nil))
	case errors.Is(err, rules.ErrNotFound):
		c.AbortWithStatusJSON(http.StatusNotFound, errorBody("not_found", "not found", nil))
	case errors.As(err, &big):
		c.AbortWithStatusJSON(http.StatusRequestEntityTooLarge, errorBody("too_large", fmt.Sprintf("request body over %d bytes", big.Limit), nil))
	case errors.Is(err, context.Canceled):
		c.Abort()
	default:
		a.log.ErrorContext(c, "request failed", "route", c.FullPath(), "request_id", c.GetString("request_id"), "error", err)
		c.AbortWithStatusJSON(http.StatusInternalServerError, errorBody("internal", "internal error", nil))
	}
}

// h adapts a handler that returns an error: fail answers for it.
func (a *API) h(fn func(c *gin.Context) error) gin.HandlerFunc {
	return func(c *gin.Context) {
		if err := fn(c); err != nil {
			a.fail(c, err)
		}
	}
}
