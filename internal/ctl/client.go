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

	"github.com/sluicehq/sluice/internal/consoleapi"
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

// The request and answer types are consoleapi's, generated from the
// console's OpenAPI document; the list envelopes below name only the
// fields these calls read.

// yamlByName returns each domain's YAML by name.
func yamlByName(s consoleapi.Snapshot) map[string]string {
	m := make(map[string]string, len(s.Domains))
	for _, d := range s.Domains {
		m[d.Name] = d.YAML
	}
	return m
}

// Ruleset returns the current version and every domain.
func (c *Client) Ruleset(ctx context.Context) (consoleapi.Snapshot, error) {
	var s consoleapi.Snapshot
	_, err := c.call(ctx, "GET", "/api/v1/ruleset", nil, &s)
	return s, err
}

// Preview replays the last hour of traffic against a draft of domain.
func (c *Client) Preview(ctx context.Context, domain, yaml string) (consoleapi.Preview, error) {
	var p consoleapi.Preview
	_, err := c.call(ctx, "POST", "/api/v1/preview", consoleapi.PreviewRequest{Domain: domain, YAML: yaml}, &p)
	return p, err
}

// Published is what a publish did: the new version (the console's 200), or
// (Version 0) the change request it proposed instead because approval is
// required (202).
type Published struct {
	consoleapi.Published
	Change *consoleapi.ChangeRequest `json:"change,omitempty"`
}

// publish makes a publishing call and reads either answer.
func (c *Client) publish(ctx context.Context, method, path string, body any) (Published, error) {
	pub, change, err := proposable[consoleapi.Published](ctx, c, method, path, body)
	if err != nil {
		return Published{}, err
	}
	return Published{Published: pub, Change: change}, nil
}

// proposable makes a call the console answers either with a T (2xx) or,
// when approval is required, with 202 and the change request it proposed
// instead (then the T is zero).
func proposable[T any](ctx context.Context, c *Client, method, path string, body any) (T, *consoleapi.ChangeRequest, error) {
	var out T
	resp, err := c.send(ctx, method, path, body)
	if err != nil {
		return out, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	if err != nil {
		return out, nil, fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode == http.StatusAccepted {
		var proposed consoleapi.Proposed
		if err := json.Unmarshal(raw, &proposed); err != nil {
			return out, nil, fmt.Errorf("%s %s: decode answer: %w", method, path, err)
		}
		return out, &proposed.Change, nil
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return out, nil, fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return out, nil, nil
}

// PutRuleset publishes every domain of ch and its deletions as one version.
func (c *Client) PutRuleset(ctx context.Context, ch consoleapi.RulesetRequest) (Published, error) {
	return c.publish(ctx, "PUT", "/api/v1/ruleset", ch)
}

// Versions returns up to limit versions, newest first (limit 0: the
// console's default page).
func (c *Client) Versions(ctx context.Context, limit int) ([]consoleapi.Version, error) {
	var out struct {
		Versions []consoleapi.Version `json:"versions"`
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
	Version consoleapi.Version          `json:"version"`
	Domains []consoleapi.DomainRevision `json:"domains"`
}

// Version returns version n and its ruleset.
func (c *Client) Version(ctx context.Context, n int64) (VersionDetail, error) {
	var v VersionDetail
	_, err := c.call(ctx, "GET", "/api/v1/versions/"+strconv.FormatInt(n, 10), nil, &v)
	return v, err
}

// Diff compares versions a and b (0 is the empty ruleset). The domains are
// rules.DomainDiff, the type the console encodes them from.
func (c *Client) Diff(ctx context.Context, a, b int64) ([]rules.DomainDiff, error) {
	var d struct {
		Domains []rules.DomainDiff `json:"domains"`
	}
	_, err := c.call(ctx, "GET", fmt.Sprintf("/api/v1/versions/%d/diff/%d", a, b), nil, &d)
	return d.Domains, err
}

// Rollback publishes a new version whose content is version n's.
func (c *Client) Rollback(ctx context.Context, n int64, message, breakGlass string) (Published, error) {
	body := consoleapi.RollbackRequest{Message: message}
	if breakGlass != "" {
		body.BreakGlassReason = &breakGlass
	}
	return c.publish(ctx, "POST", fmt.Sprintf("/api/v1/versions/%d/rollback", n), body)
}

// Audit returns the audit events matching query (actor, action, target,
// domain, since, until, limit), newest first.
func (c *Client) Audit(ctx context.Context, query url.Values) ([]consoleapi.AuditEvent, error) {
	var out struct {
		Events []consoleapi.AuditEvent `json:"events"`
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

// VerifyAudit checks the audit hash chain.
func (c *Client) VerifyAudit(ctx context.Context) (consoleapi.AuditVerification, error) {
	var v consoleapi.AuditVerification
	_, err := c.call(ctx, "GET", "/api/v1/audit/verify", nil, &v)
	return v, err
}

// NodeList is the node registry and the current version.
type NodeList struct {
	Nodes          []consoleapi.Node `json:"nodes"`
	CurrentVersion int64             `json:"current_version"`
}

// Nodes returns every enforcer the console knows.
func (c *Client) Nodes(ctx context.Context) (NodeList, error) {
	var out NodeList
	_, err := c.call(ctx, "GET", "/api/v1/nodes", nil, &out)
	return out, err
}

// Tokens lists the API tokens.
func (c *Client) Tokens(ctx context.Context) ([]consoleapi.Token, error) {
	var out struct {
		Tokens []consoleapi.Token `json:"tokens"`
	}
	_, err := c.call(ctx, "GET", "/api/v1/tokens", nil, &out)
	return out.Tokens, err
}

// TokenOptions scope a new token: its domains (empty: every domain the
// creator holds), the read-only flag and, for node tokens, the fleet flag.
type TokenOptions struct {
	Domains  []string
	ReadOnly bool
	Fleet    bool
}

// CreateToken creates a token; expiresIn is a Go duration or "" for never.
func (c *Client) CreateToken(ctx context.Context, name, role, expiresIn string, opts TokenOptions) (consoleapi.TokenSecret, error) {
	var out consoleapi.TokenSecret
	body := consoleapi.TokenCreateRequest{Name: name, Role: consoleapi.TokenCreateRequestRole(role)}
	if expiresIn != "" {
		body.ExpiresIn = &expiresIn
	}
	if len(opts.Domains) > 0 {
		body.Domains = opts.Domains
	}
	if opts.ReadOnly {
		body.ReadOnly = &opts.ReadOnly
	}
	if opts.Fleet {
		body.Fleet = &opts.Fleet
	}
	_, err := c.call(ctx, "POST", "/api/v1/tokens", body, &out)
	return out, err
}

// DisableToken disables token id.
func (c *Client) DisableToken(ctx context.Context, id int64) (consoleapi.Token, error) {
	var out consoleapi.Token
	_, err := c.call(ctx, "POST", fmt.Sprintf("/api/v1/tokens/%d/disable", id), nil, &out)
	return out, err
}

func encodeQuery(q url.Values) string {
	if len(q) == 0 {
		return ""
	}
	return "?" + q.Encode()
}
