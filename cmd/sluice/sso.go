package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/backend/api"
	"github.com/sluicehq/sluice/backend/sso"
)

// ssoFlags are the console's sign-in flags: the OpenID provider and who
// may still use a password.
type ssoFlags struct {
	issuer, clientID, secretFile, redirectURL string
	roleMap, groupsClaim, scopes              string
	passwordLogin, breakGlass                 string
}

func (f *ssoFlags) define(fs *flagSet) {
	fs.string(&f.issuer, "oidc-issuer", "SLUICE_OIDC_ISSUER", "", "OpenID Connect issuer URL for single sign-on (discovery at ISSUER/.well-known/openid-configuration); empty turns SSO off")
	fs.string(&f.clientID, "oidc-client-id", "SLUICE_OIDC_CLIENT_ID", "", "the console's client ID at the OpenID provider")
	fs.string(&f.secretFile, "oidc-client-secret-file", "SLUICE_OIDC_CLIENT_SECRET_FILE", "", "file holding the console's client secret at the OpenID provider (none: a public client, PKCE only)")
	fs.string(&f.redirectURL, "oidc-redirect-url", "SLUICE_OIDC_REDIRECT_URL", "", "the console's callback as registered at the provider: https://CONSOLE/api/v1/auth/oidc/callback")
	fs.string(&f.roleMap, "oidc-role-map", "SLUICE_OIDC_ROLE_MAP", "", "groups to roles: GROUP=ROLE or GROUP=ROLE:DOMAIN,DOMAIN, separated by ';' or new lines; GROUP '*' is everyone; @FILE reads the map from FILE")
	fs.string(&f.groupsClaim, "oidc-groups-claim", "SLUICE_OIDC_GROUPS_CLAIM", "groups", "the ID token claim that lists a person's groups")
	fs.string(&f.scopes, "oidc-scopes", "SLUICE_OIDC_SCOPES", "openid,profile,email", "comma-separated scopes to request (add groups where the provider needs it for the groups claim)")
	fs.string(&f.passwordLogin, "password-login", "SLUICE_PASSWORD_LOGIN", api.PasswordLoginAll, "who may sign in with a password: all, or break-glass (only --break-glass-users; everyone else through SSO)")
	fs.string(&f.breakGlass, "break-glass-users", "SLUICE_BREAK_GLASS_USERS", "admin", "comma-separated local users who may sign in with a password when --password-login=break-glass")
}

// apply checks the flags and sets them in cfg.
func (f *ssoFlags) apply(cfg *backend.Config) error {
	cfg.PasswordLogin = f.passwordLogin
	for _, u := range strings.Split(f.breakGlass, ",") {
		if u = strings.TrimSpace(u); u != "" {
			cfg.BreakGlassUsers = append(cfg.BreakGlassUsers, u)
		}
	}
	if f.issuer == "" {
		if f.clientID != "" || f.redirectURL != "" || f.roleMap != "" {
			return fmt.Errorf("--oidc-client-id, --oidc-redirect-url and --oidc-role-map need --oidc-issuer (SLUICE_OIDC_ISSUER)")
		}
		return nil
	}
	o := sso.Config{Issuer: f.issuer, ClientID: f.clientID, RedirectURL: f.redirectURL, GroupsClaim: f.groupsClaim}
	if f.secretFile != "" {
		b, err := os.ReadFile(f.secretFile)
		if err != nil {
			return fmt.Errorf("--oidc-client-secret-file: %w", err)
		}
		if o.ClientSecret = strings.TrimSpace(string(b)); o.ClientSecret == "" {
			return fmt.Errorf("--oidc-client-secret-file %s is empty", f.secretFile)
		}
	}
	spec := f.roleMap
	if path, ok := strings.CutPrefix(spec, "@"); ok {
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("--oidc-role-map: %w", err)
		}
		spec = string(b)
	}
	m, err := sso.ParseRoleMap(spec)
	if err != nil {
		return fmt.Errorf("--oidc-role-map: %w", err)
	}
	o.RoleMap = m
	for _, s := range strings.Split(f.scopes, ",") {
		if s = strings.TrimSpace(s); s != "" {
			o.Scopes = append(o.Scopes, s)
		}
	}
	if err := o.Check(); err != nil {
		return err
	}
	cfg.OIDC = o
	return nil
}

// print writes the sign-in part of --print-config; the secret is never
// printed, only its file.
func (f *ssoFlags) print(w io.Writer, cfg backend.Config) {
	fmt.Fprintf(w, "oidc_issuer=%s\noidc_client_id=%s\noidc_client_secret_file=%s\noidc_redirect_url=%s\noidc_role_map=%s\noidc_groups_claim=%s\noidc_scopes=%s\npassword_login=%s\nbreak_glass_users=%s\n",
		f.issuer, f.clientID, f.secretFile, f.redirectURL, cfg.OIDC.RoleMap, f.groupsClaim, f.scopes, f.passwordLogin, strings.Join(cfg.BreakGlassUsers, ","))
}
