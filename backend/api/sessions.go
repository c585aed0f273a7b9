package api

import (
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/backend/store"
)

type sessionInfo = store.SessionInfo

// listMySessions answers the caller's own live sessions; the one making
// the request is marked current.
func (a *API) listMySessions(c *gin.Context) error {
	p := caller(c)
	if p.userID == 0 {
		return httpError(http.StatusForbidden, "forbidden", "only a signed-in user has sessions")
	}
	return a.answerSessions(c, p.userID)
}

// signOutEverywhere ends every session of the caller, this one included.
func (a *API) signOutEverywhere(c *gin.Context) error {
	p := caller(c)
	if p.userID == 0 {
		return httpError(http.StatusForbidden, "forbidden", "only a signed-in user has sessions")
	}
	n, err := a.store.RevokeSessions(c.Request.Context(), p.userID, 0, "auth.logout_all", a.actor(c))
	if err != nil {
		return err
	}
	http.SetCookie(c.Writer, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
		Secure: a.secure || c.Request.TLS != nil, SameSite: http.SameSiteStrictMode})
	c.JSON(http.StatusOK, gin.H{"ended": n})
	return nil
}

// listUserSessions answers a user's live sessions (admin).
func (a *API) listUserSessions(c *gin.Context) error {
	id, err := pathInt(c, "id")
	if err != nil {
		return err
	}
	if _, err := a.store.FindUser(c.Request.Context(), id); err != nil {
		return err
	}
	return a.answerSessions(c, id)
}

func (a *API) answerSessions(c *gin.Context, userID int64) error {
	ss, err := a.store.ListSessions(c.Request.Context(), userID)
	if err != nil {
		return err
	}
	current := int64(0)
	if p := caller(c); p.cookie && p.userID == userID {
		current = p.sessionID
	}
	type view struct {
		sessionInfo
		Current bool `json:"current"`
	}
	out := make([]view, len(ss))
	for i, s := range ss {
		out[i] = view{s, s.ID == current}
	}
	c.JSON(http.StatusOK, gin.H{"sessions": out})
	return nil
}

// revokeUserSessions ends one session of a user (sid), or all of them
// (admin); it takes effect on the session's next request, and its open
// streams close within seconds.
func (a *API) revokeUserSessions(c *gin.Context) error {
	id, err := pathInt(c, "id")
	if err != nil {
		return err
	}
	var sid int64
	if c.Param("sid") != "" {
		if sid, err = pathInt(c, "sid"); err != nil {
			return err
		}
	}
	n, err := a.store.RevokeSessions(c.Request.Context(), id, sid, "session.revoke", a.actor(c))
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, gin.H{"ended": n})
	return nil
}
