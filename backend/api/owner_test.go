package api_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

// mintAs signs in as username and creates a token through the API, so that
// username owns it; it returns the secret and the token's id.
func (f *fixture) mintAs(t *testing.T, username, password, body string) (string, int64) {
	t.Helper()
	b := f.browser(t)
	if status, got := b.login(username, password); status != 200 {
		t.Fatalf("login %s: %d %s", username, status, got)
	}
	status, got := b.do("POST", "/api/v1/tokens", body)
	if status != 201 {
		t.Fatalf("create token as %s: %d %s", username, status, got)
	}
	var out struct {
		ID    int64  `json:"id"`
		Token string `json:"token"`
	}
	if err := json.Unmarshal([]byte(got), &out); err != nil {
		t.Fatal(err)
	}
	return out.Token, out.ID
}

// TestTokenNeverHoldsMoreThanOwner: a demoted creator's admin token acts as
// their new role, a disabled creator's token stops working, and handing the
// token to another admin gives it back what the new owner holds.
func TestTokenNeverHoldsMoreThanOwner(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	root, err := f.store.CreateUser(ctx, "root", "root-password", "admin", sys)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.CreateUser(ctx, "heir", "heir-password", "admin", sys); err != nil {
		t.Fatal(err)
	}
	secret, id := f.mintAs(t, "root", "root-password", `{"name":"ci","role":"admin"}`)
	f.tokens["minted"] = secret

	var me struct {
		Role string `json:"role"`
	}
	f.decodeJSON(t, "GET", "/api/v1/me", "minted", "", 200, &me)
	if me.Role != "admin" {
		t.Fatalf("role before demotion = %q, want admin", me.Role)
	}
	if _, err := f.store.SetUserRole(ctx, root.ID, "viewer", sys); err != nil {
		t.Fatal(err)
	}
	f.decodeJSON(t, "GET", "/api/v1/me", "minted", "", 200, &me)
	if me.Role != "viewer" {
		t.Errorf("role after the owner's demotion = %q, want viewer", me.Role)
	}
	// The demoted admin cannot use the token to re-promote themselves.
	if status, body := f.call(t, "PUT", "/api/v1/users/"+strconv.FormatInt(root.ID, 10)+"/role", "minted", `{"role":"admin"}`); status != 403 {
		t.Errorf("re-promotion through the token = %d %s, want 403", status, body)
	}
	if status, _ := f.call(t, "GET", "/api/v1/ruleset", "minted", ""); status != 200 {
		t.Errorf("a viewer's read through the token = %d, want 200", status)
	}
	var listed struct {
		Tokens []struct {
			ID            int64   `json:"id"`
			Owner         *string `json:"owner"`
			EffectiveRole string  `json:"effective_role"`
			OwnerDisabled bool    `json:"owner_disabled"`
		} `json:"tokens"`
	}
	f.decodeJSON(t, "GET", "/api/v1/tokens", "admin", "", 200, &listed)
	for _, tok := range listed.Tokens {
		if tok.ID == id && (tok.Owner == nil || *tok.Owner != "root" || tok.EffectiveRole != "viewer") {
			t.Errorf("listed token = owner %v effective %q, want root, viewer", tok.Owner, tok.EffectiveRole)
		}
	}

	if _, err := f.store.SetUserRole(ctx, root.ID, "admin", sys); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.SetUserDisabled(ctx, root.ID, true, sys); err != nil {
		t.Fatal(err)
	}
	if status, body := f.call(t, "GET", "/api/v1/me", "minted", ""); status != 401 {
		t.Errorf("token of a disabled owner = %d %s, want 401", status, body)
	}

	// Handing it to another admin makes it work again, as theirs.
	if status, body := f.call(t, "PUT", "/api/v1/tokens/"+strconv.FormatInt(id, 10)+"/owner", "admin", `{"owner":"nobody"}`); status != 404 {
		t.Errorf("hand to an unknown user = %d %s, want 404", status, body)
	}
	if status, body := f.call(t, "PUT", "/api/v1/tokens/"+strconv.FormatInt(id, 10)+"/owner", "admin", `{"owner":"root"}`); status != 409 {
		t.Errorf("hand to a disabled user = %d %s, want 409", status, body)
	}
	if status, body := f.call(t, "PUT", "/api/v1/tokens/"+strconv.FormatInt(id, 10)+"/owner", "editor", `{"owner":"heir"}`); status != 403 {
		t.Errorf("an editor hands a token over = %d %s, want 403", status, body)
	}
	if status, body := f.call(t, "PUT", "/api/v1/tokens/"+strconv.FormatInt(id, 10)+"/owner", "admin", `{"owner":"heir"}`); status != 200 || !strings.Contains(body, `"owner":"heir"`) {
		t.Fatalf("hand over = %d %s", status, body)
	}
	f.decodeJSON(t, "GET", "/api/v1/me", "minted", "", 200, &me)
	if me.Role != "admin" {
		t.Errorf("role after hand-over to an admin = %q, want admin", me.Role)
	}
	_, body := f.call(t, "GET", "/api/v1/audit?action=token.owner", "admin", "")
	if !strings.Contains(body, `"owner":"heir"`) || !strings.Contains(body, `"owner":"root"`) {
		t.Errorf("hand-over audit event: %s", excerpt(body))
	}
	if status, body := f.call(t, "GET", "/api/v1/audit/verify", "viewer", ""); !strings.Contains(body, `"ok":true`) {
		t.Errorf("audit chain: %d %s", status, body)
	}
}

// TestNodeTokenOfDisabledOwner: a node token already bound to a node keeps
// serving it when its creator is disabled; one no node has used stops.
func TestNodeTokenOfDisabledOwner(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	root, err := f.store.CreateUser(ctx, "root", "root-password", "admin", sys)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.CreateUser(ctx, "heir", "heir-password", "admin", sys); err != nil {
		t.Fatal(err)
	}
	bound, boundID := f.mintAs(t, "root", "root-password", `{"name":"n1","role":"node"}`)
	unbound, _ := f.mintAs(t, "root", "root-password", `{"name":"n2","role":"node"}`)
	if _, err := f.store.ClaimNode(ctx, boundID, "node-1", sys); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.SetUserDisabled(ctx, root.ID, true, sys); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.FindToken(ctx, bound); err != nil {
		t.Errorf("bound node token of a disabled owner: %v, want it working", err)
	}
	if _, err := f.store.FindToken(ctx, unbound); err == nil {
		t.Errorf("unbound node token of a disabled owner works, want it refused")
	}
}
