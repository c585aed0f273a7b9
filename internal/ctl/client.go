package ctl

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/rules"
)

// Client is a small typed client of the console's REST API, authenticated
// with a Bearer token.
type Client struct {
	base  *url.URL
	token string
	http  *http.Client
}

// NewClient returns a client of the console at baseURL.
func NewClient(baseURL, token string) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(baseURL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("console URL %q: want http(s)://host[:port]", baseURL)
	}
	// A bound on the wait for an answer, not on reading it: an audit export
	// streams for as long as it takes.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.ResponseHeaderTimeout = 60 * time.Second
	return &Client{base: u, token: token, http: &http.Client{Transport: tr}}, nil
}

// APIError is an error answer of the console:
// {"error":{"code","message","details"}}.
type APIError struct {
	Status  int
	Code    string
	Message string
	Details json.RawMessage
}

func (e *APIError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("console answered %d", e.Status)
	}
	return fmt.Sprintf("console answered %d: %s", e.Status, e.Message)
}

// Problems decodes the details of a 422 into rule problems.
func (e *APIError) Problems() []rules.Problem {
	var ps []rules.Problem
	if e.Status != http.StatusUnprocessableEntity || json.Unmarshal(e.Details, &ps) != nil {
		return nil
	}
	return ps
}

// maxAnswerBytes bounds an answer the client reads into memory (a snapshot
// is at most 16 MiB).
const maxAnswerBytes = 64 << 20

// send makes a request with a JSON body (nil for none) and returns the
// response when its status is 2xx; otherwise it returns an *APIError.
func (c *Client) send(ctx context.Context, method, path string, body any) (*http.Response, error) {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("encode request: %w", err)
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base.String()+path, r)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	req.Header.Set("User-Agent", "sluice-ctl")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var env struct {
		Error struct {
			Code    string          `json:"code"`
			Message string          `json:"message"`
			Details json.RawMessage `json:"details"`
		} `json:"error"`
	}
	ae := &APIError{Status: resp.StatusCode}
	if json.Unmarshal(raw, &env) == nil && env.Error.Code != "" {
		ae.Code, ae.Message, ae.Details = env.Error.Code, env.Error.Message, env.Error.Details
	} else {
		ae.Message = strings.TrimSpace(string(raw))
		if len(ae.Message) > 200 {
			ae.Message = ae.Message[:200] + "..."
		}
	}
	if resp.StatusCode == http.StatusUnauthorized {
		ae.Message += " (set SLUICE_TOKEN or the config file's token)"
	}
	return nil, ae
}

// call makes a request and decodes a JSON answer into out (if not nil).
// It returns the answer's status.
func (c *Client) call(ctx context.Context, method, path string, body, out any) (int, error) {
	resp, err := c.send(ctx, method, path, body)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	if err != nil {
		return 0, fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return 0, fmt.Errorf("%s %s: decode answer: %w", method, path, err)
		}
	}
	return resp.StatusCode, nil
}

// Domain is a domain's YAML as of a version, and the version that last
// changed it.
type Domain struct {
	Name      string    `json:"name"`
	YAML      string    `json:"yaml"`
	Version   int64     `json:"version"`
	ChangedAt time.Time `json:"changed_at"`
	Author    string    `json:"author"`
	Message   string    `json:"message"`
}

// Snapshot is the ruleset at one version.
type Snapshot struct {
	Version  int64    `json:"version"`
	Checksum string   `json:"checksum"`
	Domains  []Domain `json:"domains"`
	// RulesVersion is the latest version that changed a domain's own YAML;
	// versions that only start or end temporary overrides do not move it.
	RulesVersion int64 `json:"rules_version"`
}

// YAMLByName returns each domain's YAML by name.
func (s Snapshot) YAMLByName() map[string]string {
	m := make(map[string]string, len(s.Domains))
	for _, d := range s.Domains {
		m[d.Name] = d.YAML
	}
	return m
}

// Ruleset returns the current version and every domain.
func (c *Client) Ruleset(ctx context.Context) (Snapshot, error) {
	var s Snapshot
	_, err := c.call(ctx, "GET", "/api/v1/ruleset", nil, &s)
	return s, err
}

// Preview is POST /api/v1/preview's answer: what each changed or new limit
// of a draft domain would have done to the last hour of real traffic.
type Preview struct {
	Domain  string         `json:"domain"`
	WindowS int64          `json:"window_s"`
	Limits  []PreviewLimit `json:"limits"`
}

// PreviewLimit is one limit's replay (see the console's openapi.yaml).
type PreviewLimit struct {
	Name           string `json:"name"`
	Change         string `json:"change"`
	Previewable    bool   `json:"previewable"`
	Reason         string `json:"reason,omitempty"`
	Estimate       bool   `json:"estimate"`
	EstimateReason string `json:"estimate_reason,omitempty"`
	Totals         struct {
		Requests       int64 `json:"requests"`
		Limited        int64 `json:"limited"`
		WouldLimit     int64 `json:"would_limit"`
		WouldLimitLow  int64 `json:"would_limit_low"`
		WouldLimitHigh int64 `json:"would_limit_high"`
		ValuesMax      int64 `json:"values_max"`
	} `json:"totals"`
}

// Preview replays the last hour of traffic against a draft of domain.
func (c *Client) Preview(ctx context.Context, domain, yaml string) (Preview, error) {
	var p Preview
	_, err := c.call(ctx, "POST", "/api/v1/preview", map[string]string{"domain": domain, "yaml": yaml}, &p)
	return p, err
}

// RulesetChange is the body of PUT /api/v1/ruleset.
type RulesetChange struct {
	Domains          map[string]string `json:"domains,omitempty"`
	Delete           []string          `json:"delete,omitempty"`
	Message          string            `json:"message"`
	BaseVersion      int64             `json:"base_version"`
	BreakGlassReason string            `json:"break_glass_reason,omitempty"`
}

// Published is the answer to a publish: the new version, or (Version 0) the
// change request proposed because approval is required.
type Published struct {
	Version    int64          `json:"version,omitempty"`
	RollbackOf int64          `json:"rollback_of,omitempty"`
	Change     *ChangeRequest `json:"change,omitempty"`
}

// ChangeRequest is a publish waiting for a second person's approval.
type ChangeRequest struct {
	ID     int64  `json:"id"`
	Kind   string `json:"kind"`
	Status string `json:"status"`
	Author string `json:"author"`
}

// PutRuleset publishes every domain of ch and its deletions as one version.
func (c *Client) PutRuleset(ctx context.Context, ch RulesetChange) (Published, error) {
	var p Published
	_, err := c.call(ctx, "PUT", "/api/v1/ruleset", ch, &p)
	return p, err
}

// Version is one published version.
type Version struct {
	Version    int64     `json:"version"`
	CreatedAt  time.Time `json:"created_at"`
	Author     string    `json:"author"`
	Message    string    `json:"message"`
	RollbackOf *int64    `json:"rollback_of"`
	Checksum   string    `json:"checksum"`
	ApprovedBy string    `json:"approved_by,omitempty"`
	Domains    []string  `json:"domains"`
	AppliedBy  *int      `json:"applied_by"`
	Connected  *int      `json:"connected"`
}

// Versions returns up to limit versions, newest first (limit 0: the
// console's default page).
func (c *Client) Versions(ctx context.Context, limit int) ([]Version, error) {
	var out struct {
		Versions []Version `json:"versions"`
	}
	path := "/api/v1/versions"
	if limit > 0 {
		path += "?limit=" + strconv.Itoa(limit)
	}
	_, err := c.call(ctx, "GET", path, nil, &out)
	return out.Versions, err
}

// VersionDetail is one version and its whole ruleset.
type VersionDetail struct {
	Version Version  `json:"version"`
	Domains []Domain `json:"domains"`
}

// Version returns version n and its ruleset.
func (c *Client) Version(ctx context.Context, n int64) (VersionDetail, error) {
	var v VersionDetail
	_, err := c.call(ctx, "GET", "/api/v1/versions/"+strconv.FormatInt(n, 10), nil, &v)
	return v, err
}

// VersionDiff is what changed from one version to another.
type VersionDiff struct {
	From    int64              `json:"from"`
	To      int64              `json:"to"`
	Domains []rules.DomainDiff `json:"domains"`
}

// Diff compares versions a and b (0 is the empty ruleset).
func (c *Client) Diff(ctx context.Context, a, b int64) (VersionDiff, error) {
	var d VersionDiff
	_, err := c.call(ctx, "GET", fmt.Sprintf("/api/v1/versions/%d/diff/%d", a, b), nil, &d)
	return d, err
}

// Rollback publishes a new version whose content is version n's.
func (c *Client) Rollback(ctx context.Context, n int64, message, breakGlass string) (Published, error) {
	var p Published
	body := map[string]string{"message": message}
	if breakGlass != "" {
		body["break_glass_reason"] = breakGlass
	}
	_, err := c.call(ctx, "POST", fmt.Sprintf("/api/v1/versions/%d/rollback", n), body, &p)
	return p, err
}

// AuditEvent is one entry of the audit chain.
type AuditEvent struct {
	ID        int64           `json:"id"`
	At        time.Time       `json:"at"`
	Actor     string          `json:"actor"`
	Action    string          `json:"action"`
	Target    string          `json:"target"`
	Before    json.RawMessage `json:"before"`
	After     json.RawMessage `json:"after"`
	Message   string          `json:"message"`
	IP        string          `json:"ip"`
	UserAgent string          `json:"user_agent"`
	RequestID string          `json:"request_id"`
	PrevHash  string          `json:"prev_hash"`
	Hash      string          `json:"hash"`
}

// Audit returns the audit events matching query (actor, action, target,
// domain, since, until, limit), newest first.
func (c *Client) Audit(ctx context.Context, query url.Values) ([]AuditEvent, error) {
	var out struct {
		Events []AuditEvent `json:"events"`
	}
	_, err := c.call(ctx, "GET", "/api/v1/audit"+encodeQuery(query), nil, &out)
	return out.Events, err
}

// AuditCSV copies every audit event matching query, as CSV, to w.
func (c *Client) AuditCSV(ctx context.Context, query url.Values, w io.Writer) error {
	q := url.Values{}
	for k, v := range query {
		q[k] = v
	}
	q.Set("format", "csv")
	resp, err := c.send(ctx, "GET", "/api/v1/audit"+encodeQuery(q), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("audit export: %w", err)
	}
	return nil
}

// AuditVerification is the result of checking the audit hash chain.
type AuditVerification struct {
	OK       bool   `json:"ok"`
	Events   int64  `json:"events"`
	BrokenID int64  `json:"broken_id,omitempty"`
	Reason   string `json:"reason,omitempty"`
}

// VerifyAudit checks the audit hash chain.
func (c *Client) VerifyAudit(ctx context.Context) (AuditVerification, error) {
	var v AuditVerification
	_, err := c.call(ctx, "GET", "/api/v1/audit/verify", nil, &v)
	return v, err
}

// Node is an enforcer the console knows.
type Node struct {
	ID             string            `json:"id"`
	AppliedVersion int64             `json:"applied_version"`
	Status         string            `json:"status"`
	Labels         map[string]string `json:"labels"`
	Build          string            `json:"build"`
	Address        string            `json:"address"`
	LastSeen       time.Time         `json:"last_seen"`
	NackVersion    *int64            `json:"nack_version"`
	NackError      string            `json:"nack_error"`
	Console        string            `json:"console"`
	Rates          json.RawMessage   `json:"rates"`
}

// NodeList is the node registry and the current version.
type NodeList struct {
	Nodes          []Node `json:"nodes"`
	CurrentVersion int64  `json:"current_version"`
}

// Nodes returns every enforcer the console knows.
func (c *Client) Nodes(ctx context.Context) (NodeList, error) {
	var out NodeList
	_, err := c.call(ctx, "GET", "/api/v1/nodes", nil, &out)
	return out, err
}

// Token is an API token (never its secret).
type Token struct {
	ID        int64      `json:"id"`
	Name      string     `json:"name"`
	Role      string     `json:"role"`
	Last4     string     `json:"last4"`
	CreatedBy string     `json:"created_by"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt *time.Time `json:"expires_at"`
	Disabled  bool       `json:"disabled"`
	NodeID    *string    `json:"node_id"`
}

// Tokens lists the API tokens.
func (c *Client) Tokens(ctx context.Context) ([]Token, error) {
	var out struct {
		Tokens []Token `json:"tokens"`
	}
	_, err := c.call(ctx, "GET", "/api/v1/tokens", nil, &out)
	return out.Tokens, err
}

// TokenSecret is a new token with its secret, shown once.
type TokenSecret struct {
	ID        int64      `json:"id"`
	Token     string     `json:"token"`
	Name      string     `json:"name"`
	Role      string     `json:"role"`
	Last4     string     `json:"last4"`
	ExpiresAt *time.Time `json:"expires_at"`
}

// CreateToken creates a token; expiresIn is a Go duration or "" for never.
func (c *Client) CreateToken(ctx context.Context, name, role, expiresIn string) (TokenSecret, error) {
	var out TokenSecret
	body := map[string]string{"name": name, "role": role}
	if expiresIn != "" {
		body["expires_in"] = expiresIn
	}
	_, err := c.call(ctx, "POST", "/api/v1/tokens", body, &out)
	return out, err
}

// DisableToken disables token id.
func (c *Client) DisableToken(ctx context.Context, id int64) (Token, error) {
	var out Token
	_, err := c.call(ctx, "POST", fmt.Sprintf("/api/v1/tokens/%d/disable", id), nil, &out)
	return out, err
}

func encodeQuery(q url.Values) string {
	if len(q) == 0 {
		return ""
	}
	return "?" + q.Encode()
}
