package api_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/store"
)

// TestScopedWrites: a role granted some domains reads every domain and
// writes only its own; a write touching one other domain is refused whole,
// with the reason; an approval needs editor on every domain the change
// touches.
func TestScopedWrites(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	v1, err := f.store.Publish(ctx, store.Change{Domain: "api", YAML: domainYAML("api", 10), Message: "m", Actor: sys})
	if err != nil {
		t.Fatal(err)
	}
	v2, err := f.store.Publish(ctx, store.Change{Domain: "search", YAML: domainYAML("search", 10), Message: "m", Actor: sys})
	if err != nil {
		t.Fatal(err)
	}
	f.scopedToken(t, "api-team", store.TokenSpec{Name: "api-team", Role: "editor", Domains: []string{"api"}})

	// Reads stay open.
	for _, path := range []string{"/api/v1/domains/search", "/api/v1/ruleset", "/api/v1/versions"} {
		if status, body := f.call(t, "GET", path, "api-team", ""); status != 200 {
			t.Errorf("GET %s = %d %s", path, status, body)
		}
	}
	refused := []struct{ method, path, body string }{
		{"PUT", "/api/v1/domains/search", publishBody("search", 5, v2, "m")},
		{"PUT", "/api/v1/domains/brand-new", publishBody("brand-new", 5, 0, "m")},
		{"DELETE", "/api/v1/domains/search", `{"message":"m","base_version":` + itoa(v2) + `}`},
		{"POST", "/api/v1/domains/search/rollback", `{"to_version":1,"message":"m"}`},
		{"PUT", "/api/v1/ruleset", `{"domains":{"api":` + jsonString(domainYAML("api", 7)) + `,"search":` + jsonString(domainYAML("search", 7)) + `},"message":"m"}`},
		// Rolling back to version 1 removes search too.
		{"POST", "/api/v1/versions/" + itoa(v1) + "/rollback", `{"message":"m"}`},
		{"POST", "/api/v1/changes", `{"domain":"search","yaml":` + jsonString(domainYAML("search", 3)) + `,"message":"m"}`},
	}
	for _, r := range refused {
		status, body := f.call(t, r.method, r.path, "api-team", r.body)
		if status != 403 || !strings.Contains(body, `"domain_forbidden"`) || !strings.Contains(body, "api only") {
			t.Errorf("%s %s = %d %s; want 403 domain_forbidden saying why", r.method, r.path, status, excerpt(body))
		}
	}
	var snap struct {
		Version int64 `json:"version"`
	}
	f.decodeJSON(t, "GET", "/api/v1/ruleset", "viewer", "", 200, &snap)
	if snap.Version != v2 {
		t.Fatalf("version after refused writes = %d, want %d (nothing half-applied)", snap.Version, v2)
	}
	// Its own domain it writes.
	status, body := f.call(t, "PUT", "/api/v1/domains/api", "api-team", publishBody("api", 20, v1, "m"))
	if status != 200 {
		t.Fatalf("publish own domain = %d %s", status, body)
	}
	f.decodeJSON(t, "GET", "/api/v1/ruleset", "viewer", "", 200, &snap)

	// Four-eyes: a change touching api and search waits for someone who
	// holds editor on both.
	if _, err := f.store.UpdateSettings(ctx, store.SettingsUpdate{RequireApproval: ptr(true)}, sys); err != nil {
		t.Fatal(err)
	}
	var proposed struct {
		Change struct {
			ID int64 `json:"id"`
		} `json:"change"`
	}
	f.decodeJSON(t, "PUT", "/api/v1/ruleset", "admin",
		`{"domains":{"api":`+jsonString(domainYAML("api", 8))+`,"search":`+jsonString(domainYAML("search", 8))+`},"message":"both","base_version":`+itoa(snap.Version)+`}`, 202, &proposed)
	path := "/api/v1/changes/" + itoa(proposed.Change.ID) + "/approve"
	if status, body := f.call(t, "POST", path, "api-team", ""); status != 403 || !strings.Contains(body, "search") {
		t.Errorf("scoped approval of a change touching search = %d %s; want 403", status, body)
	}
	_, reviewer, err := f.store.CreateToken(ctx, "reviewer", "editor", nil, store.Actor{Name: "user:eve"})
	if err != nil {
		t.Fatal(err)
	}
	f.tokens["reviewer"] = reviewer
	if status, body := f.call(t, "POST", path, "reviewer", ""); status != 200 {
		t.Errorf("approval by an editor of every domain = %d %s", status, body)
	}
}

// TestScopedTokenNeverWider: a token minted by an admin of some domains, or
// by a token that expires, never holds more than its minter.
func TestScopedTokenNeverWider(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	// sadmin is an admin of scopedDomain only.
	for _, body := range []string{
		`{"name":"wide","role":"admin","domains":["` + scopedDomain + `","other"]}`,
		`{"name":"other","role":"editor","domains":["other"]}`,
	} {
		if status, got := f.call(t, "POST", "/api/v1/tokens", "sadmin", body); status != 403 || !strings.Contains(got, "too_wide") {
			t.Errorf("POST /tokens %s as a scoped admin = %d %s; want 403 too_wide", body, status, got)
		}
	}
	var minted struct {
		Token   string   `json:"token"`
		Domains []string `json:"domains"`
	}
	f.decodeJSON(t, "POST", "/api/v1/tokens", "sadmin", `{"name":"narrow","role":"editor"}`, 201, &minted)
	if len(minted.Domains) != 1 || minted.Domains[0] != scopedDomain {
		t.Errorf("domains of a token a scoped admin minted = %v, want [%s]", minted.Domains, scopedDomain)
	}
	f.tokens["narrow"] = minted.Token
	if status, body := f.call(t, "PUT", "/api/v1/domains/api", "narrow", publishBody("api", 5, 0, "m")); status != 403 {
		t.Errorf("the minted token writes api = %d %s; want 403", status, body)
	}
	if status, body := f.call(t, "PUT", "/api/v1/domains/"+scopedDomain, "narrow", publishBody(scopedDomain, 5, 0, "m")); status != 200 {
		t.Errorf("the minted token writes its domain = %d %s", status, body)
	}
	// Non-admins never mint.
	for _, cred := range []string{"editor", "seditor", "support", "viewer"} {
		if status, _ := f.call(t, "POST", "/api/v1/tokens", cred, `{"name":"x","role":"viewer"}`); status != 403 {
			t.Errorf("POST /tokens as %s = %d, want 403", cred, status)
		}
	}
	// A token that expires mints none that outlives it.
	soon := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	f.token(t, "temp", "admin", &soon)
	if status, body := f.call(t, "POST", "/api/v1/tokens", "temp", `{"name":"long","role":"viewer","expires_in":"720h"}`); status != 403 {
		t.Errorf("minting a token outliving its minter = %d %s; want 403", status, body)
	}
	var inherited struct {
		ExpiresAt *time.Time `json:"expires_at"`
	}
	f.decodeJSON(t, "POST", "/api/v1/tokens", "temp", `{"name":"same","role":"viewer"}`, 201, &inherited)
	if inherited.ExpiresAt == nil || !inherited.ExpiresAt.Equal(soon) {
		t.Errorf("expiry of a token minted by an expiring one = %v, want %v", inherited.ExpiresAt, soon)
	}
	// Read-only tokens make GET requests only.
	var ro struct {
		Token string `json:"token"`
	}
	f.decodeJSON(t, "POST", "/api/v1/tokens", "admin", `{"name":"ro","role":"admin","read_only":true}`, 201, &ro)
	f.tokens["ro"] = ro.Token
	if status, body := f.call(t, "PUT", "/api/v1/domains/api", "ro", publishBody("api", 5, 0, "m")); status != 403 || !strings.Contains(body, "read_only") {
		t.Errorf("write with a read-only token = %d %s; want 403 read_only", status, body)
	}
	var me map[string]any
	f.decodeJSON(t, "GET", "/api/v1/me", "ro", "", 200, &me)
	if me["read_only"] != true {
		t.Errorf("me of a read-only token = %v", me)
	}
}

func ptr[T any](v T) *T { return &v }

// TestFleetTokenCreate: POST /api/v1/tokens makes fleet node tokens, and
// only node tokens may be fleet tokens; the list shows the flag and no
// node id.
func TestFleetTokenCreate(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var created struct {
		ID    int64  `json:"id"`
		Token string `json:"token"`
		Fleet bool   `json:"fleet"`
		Role  string `json:"role"`
	}
	f.decodeJSON(t, "POST", "/api/v1/tokens", "admin", `{"name":"enforcers","role":"node","fleet":true}`, 201, &created)
	if !created.Fleet || created.Role != "node" || !strings.HasPrefix(created.Token, "slc_") {
		t.Errorf("created %+v, want a fleet node token", created)
	}
	for _, body := range []string{
		`{"name":"x","role":"viewer","fleet":true}`,
		`{"name":"x","role":"admin","fleet":true}`,
		`{"name":"x","role":"node","fleet":true,"read_only":true}`,
	} {
		if status, resp := f.call(t, "POST", "/api/v1/tokens", "admin", body); status != 400 || !strings.Contains(resp, "node tokens") {
			t.Errorf("POST /tokens %s = %d %s, want 400 naming node tokens", body, status, resp)
		}
	}
	if status, _ := f.call(t, "POST", "/api/v1/tokens", "editor", `{"name":"x","role":"node","fleet":true}`); status != 403 {
		t.Errorf("an editor minting a fleet token = %d, want 403", status)
	}
	var listed struct {
		Tokens []struct {
			ID     int64   `json:"id"`
			Fleet  bool    `json:"fleet"`
			NodeID *string `json:"node_id"`
		} `json:"tokens"`
	}
	f.decodeJSON(t, "GET", "/api/v1/tokens", "admin", "", 200, &listed)
	found := false
	for _, tok := range listed.Tokens {
		if tok.ID == created.ID {
			found = tok.Fleet && tok.NodeID == nil
		}
	}
	if !found {
		t.Errorf("GET /tokens does not list token %d as a fleet token without a node id: %+v", created.ID, listed.Tokens)
	}
}
