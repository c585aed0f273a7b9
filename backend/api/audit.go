package api

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/backend/store"
)

// timeFormat renders times in API bodies and exports.
const timeFormat = time.RFC3339Nano

// auditFilter reads the audit list's query: actor, action, target, domain,
// since, until, cursor and limit.
func auditFilter(c *gin.Context) (store.AuditFilter, error) {
	cursor, limit, err := page(c)
	if err != nil {
		return store.AuditFilter{}, err
	}
	f := store.AuditFilter{Actor: c.Query("actor"), Action: c.Query("action"), Target: c.Query("target"),
		Domain: c.Query("domain"), Before: cursor, Limit: limit}
	if f.Since, err = queryTime(c, "since"); err != nil {
		return f, err
	}
	if f.Until, err = queryTime(c, "until"); err != nil {
		return f, err
	}
	return f, nil
}

// redactFor returns how the caller reads audit values: admins in full;
// everyone else with secrets cut (see redactSecrets). The trail stores
// every event whole, so its hash chain verifies either way.
func redactFor(c *gin.Context) func(store.AuditEvent) store.AuditEvent {
	if p := caller(c); p != nil && p.role == store.RoleAdmin {
		return func(ev store.AuditEvent) store.AuditEvent { return ev }
	}
	return func(ev store.AuditEvent) store.AuditEvent {
		ev.Before, ev.After = redactSecrets(ev.Before), redactSecrets(ev.After)
		return ev
	}
}

// redactSecrets cuts the secrets out of an audit value, whatever event it
// belongs to: a URL under a key named "url" or ending in "_url" keeps only
// its scheme and host (webhook URLs carry their credential in the path or
// query, as Slack's do), and a value under a key naming a secret, password
// or token is replaced. Anything that is not JSON is returned as it is.
func redactSecrets(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return raw
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return raw
	}
	out, err := json.Marshal(redactValue("", v))
	if err != nil {
		return raw
	}
	return out
}

func redactValue(key string, v any) any {
	k := strings.ToLower(key)
	switch t := v.(type) {
	case map[string]any:
		for kk, vv := range t {
			t[kk] = redactValue(kk, vv)
		}
		return t
	case []any:
		for i, vv := range t {
			t[i] = redactValue(key, vv)
		}
		return t
	case string:
		switch {
		case k == "url" || strings.HasSuffix(k, "_url"):
			return redactURL(t)
		case strings.Contains(k, "secret") || strings.Contains(k, "password") || k == "token" || strings.HasSuffix(k, "_token"):
			return redacted
		}
	}
	return v
}

// redacted stands for a value only admins read.
const redacted = "[redacted]"

// redactURL keeps a URL's scheme and host.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return redacted
	}
	return u.Scheme + "://" + u.Host + "/" + redacted
}

var auditColumns = []string{"id", "at", "actor", "action", "target", "before", "after", "message",
	"ip", "user_agent", "request_id", "prev_hash", "hash"}

// exportAudit streams every event matching f (from f's cursor on, newest
// first) as CSV, reading the database a page at a time. limit sets the page
// size, not the total.
func (a *API) exportAudit(c *gin.Context, f store.AuditFilter) error {
	f.Limit = 1000
	events, next, err := a.store.ListAudit(c.Request.Context(), f)
	if err != nil {
		return err
	}
	redact := redactFor(c)
	c.Header("Content-Type", "text/csv; charset=utf-8")
	c.Header("Content-Disposition", `attachment; filename="sluice-audit.csv"`)
	c.Status(http.StatusOK)
	w := csv.NewWriter(c.Writer)
	w.Write(auditColumns)
	for {
		for _, ev := range events {
			ev = redact(ev)
			w.Write([]string{
				strconv.FormatInt(ev.ID, 10), ev.At.UTC().Format(timeFormat), cell(ev.Actor), cell(ev.Action),
				cell(ev.Target), cell(string(ev.Before)), cell(string(ev.After)), cell(ev.Message), cell(ev.IP),
				cell(ev.UserAgent), cell(ev.RequestID), ev.PrevHash, ev.Hash,
			})
		}
		w.Flush()
		if w.Error() != nil || next == 0 {
			return nil
		}
		f.Before = next
		if events, next, err = a.store.ListAudit(c.Request.Context(), f); err != nil {
			// The status line is out; the client sees a truncated file
			// without the trailing newline of a complete last row.
			a.log.ErrorContext(c, "export audit", "request_id", c.GetString("request_id"), "error", err)
			return nil
		}
	}
}

// cell defuses spreadsheet formulas: a text cell starting with =, +, -, @,
// tab or carriage return gets a leading apostrophe (OWASP's CSV injection
// advice), so opening the export cannot run anything.
func cell(s string) string {
	if s != "" && strings.ContainsRune("=+-@\t\r", rune(s[0])) {
		return "'" + s
	}
	return s
}

// auditStreamView is GET /api/v1/audit/stream: the settings (never the
// secret) and how far delivery has come.
type auditStreamView struct {
	store.AuditStream
	Pending int64 `json:"pending"` // events not yet acknowledged
}

func (a *API) getAuditStream(c *gin.Context) error {
	s, err := a.store.FindAuditStream(c.Request.Context())
	if err != nil {
		return err
	}
	n, err := a.store.CountAuditAfter(c.Request.Context(), s.DeliveredID)
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, auditStreamView{AuditStream: s, Pending: n})
	return nil
}

type auditStreamRequest struct {
	URL     string  `json:"url"`
	Secret  *string `json:"secret"` // absent: keep the one set
	Enabled bool    `json:"enabled"`
}

// Bounds of the audit stream's secret.
const (
	minStreamSecret = 16
	maxStreamSecret = 256
)

func (a *API) putAuditStream(c *gin.Context) error {
	var req auditStreamRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if req.URL != "" {
		u, err := url.Parse(req.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || len(req.URL) > maxWebhookURL {
			return badRequest("url must be an http or https URL of at most %d bytes", maxWebhookURL)
		}
	}
	if err := checkText("url", req.URL); err != nil {
		return err
	}
	if req.Secret != nil {
		if len(*req.Secret) < minStreamSecret || len(*req.Secret) > maxStreamSecret {
			return badRequest("secret must have %d to %d bytes", minStreamSecret, maxStreamSecret)
		}
		if err := checkText("secret", *req.Secret); err != nil {
			return err
		}
	}
	if _, err := a.store.UpdateAuditStream(c.Request.Context(),
		store.AuditStreamUpdate{URL: req.URL, Secret: req.Secret, Enabled: req.Enabled}, a.actor(c)); err != nil {
		return err
	}
	return a.getAuditStream(c)
}
