package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConsoleSSOFlags reads the single sign-on flags from the environment
// and from files, prints them without the secret, and refuses what cannot
// work before the console starts.
func TestConsoleSSOFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, []byte("s3cr3t-value\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	roles := filepath.Join(dir, "roles")
	if err := os.WriteFile(roles, []byte("# roles\nsre=admin\nteam-api=editor:api,search\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := map[string]string{
		"SLUICE_OIDC_ISSUER":             "https://idp.example.com",
		"SLUICE_OIDC_CLIENT_ID":          "sluice-console",
		"SLUICE_OIDC_CLIENT_SECRET_FILE": secretFile,
		"SLUICE_OIDC_REDIRECT_URL":       "https://sluice.example.com/api/v1/auth/oidc/callback",
		"SLUICE_OIDC_ROLE_MAP_FILE":      roles,
		"SLUICE_PASSWORD_LOGIN":          "break-glass",
		"SLUICE_BREAK_GLASS_USERS":       "admin, root",
	}
	console := func(env map[string]string, args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := run(context.Background(), append([]string{"console", "--print-config"}, args...), func(k string) string { return env[k] }, &out, &errOut)
		return out.String() + errOut.String(), err
	}
	out, err := console(base)
	if err != nil {
		t.Fatalf("print-config: %v\n%s", err, out)
	}
	for _, want := range []string{
		"oidc_issuer=https://idp.example.com\n", "oidc_client_id=sluice-console\n", "oidc_client_secret_file=" + secretFile + "\n",
		"oidc_role_map=sre=admin;team-api=editor:api,search\n", "oidc_groups_claim=groups\n", "password_login=break-glass\n",
		"break_glass_users=admin,root\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("print-config lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "s3cr3t") {
		t.Errorf("print-config shows the client secret:\n%s", out)
	}
	// The flag form, with @FILE.
	if out, err := console(map[string]string{}, "--oidc-issuer", "https://idp.example.com", "--oidc-client-id", "c",
		"--oidc-redirect-url", "https://s.example.com/api/v1/auth/oidc/callback", "--oidc-role-map", "@"+roles); err != nil || !strings.Contains(out, "oidc_role_map=sre=admin;") {
		t.Errorf("flags with @FILE: %v\n%s", err, out)
	}

	with := func(k, v string) map[string]string {
		env := map[string]string{}
		for key, val := range base {
			env[key] = val
		}
		if v == "" {
			delete(env, k)
		} else {
			env[k] = v
		}
		return env
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"bad role map", with("SLUICE_OIDC_ROLE_MAP", "sre=root"), `role "root"`},
		{"no role map", with("SLUICE_OIDC_ROLE_MAP_FILE", ""), "a role map is needed"},
		{"unreadable secret", with("SLUICE_OIDC_CLIENT_SECRET_FILE", filepath.Join(dir, "missing")), "--oidc-client-secret-file"},
		{"no client id", with("SLUICE_OIDC_CLIENT_ID", ""), "client ID"},
		{"relative redirect", with("SLUICE_OIDC_REDIRECT_URL", "/api/v1/auth/oidc/callback"), "redirect URL"},
		{"issuer not a URL", with("SLUICE_OIDC_ISSUER", "idp.example.com"), "want an http(s) URL"},
		{"client id without issuer", with("SLUICE_OIDC_ISSUER", ""), "need --oidc-issuer"},
	} {
		if out, err := console(tc.env); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v\n%s; want an error with %q", tc.name, err, out, tc.want)
		}
	}

	// Checked as the console starts, before it touches the database.
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"SLUICE_PASSWORD_LOGIN": "break-glass"}, "needs an OIDC issuer"},
		{map[string]string{"SLUICE_PASSWORD_LOGIN": "sometimes"}, "want all or break-glass"},
		{with("SLUICE_BREAK_GLASS_USERS", " , "), "at least one break-glass user"},
	} {
		var out bytes.Buffer
		err := run(context.Background(), []string{"console", "--database-url", "postgres://nobody@127.0.0.1:1/none"},
			func(k string) string { return tc.env[k] }, &out, &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("console with %v: %v; want an error with %q", tc.env, err, tc.want)
		}
	}
}
