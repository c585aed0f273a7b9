// Package backend is the Sluice console: it wires the Postgres store, the
// REST API, the node push hub and the embedded UI into one server.
package backend

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/backend/api"
	"github.com/sluicehq/sluice/backend/auditstream"
	"github.com/sluicehq/sluice/backend/hub"
	"github.com/sluicehq/sluice/backend/sso"
	"github.com/sluicehq/sluice/backend/stats"
	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/backend/xds"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/internal/serve"
	"github.com/sluicehq/sluice/web"
)

// Config is the console's configuration.
type Config struct {
	Listen        string
	DatabaseURL   string
	AdminPassword string // creates user admin on a first start with no users
	// BootstrapNodeToken and BootstrapNodeTokenFile give enforcers started
	// with the console a fleet node token (see bootstrapNodeToken): the
	// secret to use, and the file to read it from or write a new one to.
	BootstrapNodeToken     string
	BootstrapNodeTokenFile string
	SecureCookies          bool
	// TrustedProxies lists the reverse proxies (IPs or CIDRs) whose
	// X-Forwarded-For names the client, for audit IPs and sign-in
	// throttling. Empty trusts none.
	TrustedProxies []string
	// MetricsAuth makes /metrics need a viewer (or higher) credential.
	MetricsAuth bool
	// PublicURL is the console's address as users reach it, for the links
	// in alerts; empty means http:// and the listen address.
	PublicURL string
	// StatsRetention is how long per-minute traffic history is kept
	// (stats.DefaultRetention when zero).
	StatsRetention time.Duration
	// SpikeWarmup is how long a rule is watched before its spikes are
	// judged (stats.DefaultSpikeWarmup when zero); tests shorten it.
	SpikeWarmup time.Duration
	// RedisURL is the counter store the enforcers count in, in the
	// enforcer's --redis-url forms (standalone, Cluster, Sentinel), for the
	// support desk's inspect and reset; empty leaves those answering 503.
	RedisURL string
	// KeyPrefix starts every counter key, as the enforcers' KeyPrefix
	// does (engine.DefaultKeyPrefix when empty).
	KeyPrefix string
	// OIDC is the identity provider for single sign-on; an empty Issuer
	// turns it off.
	OIDC sso.Config
	// PasswordLogin is api.PasswordLoginAll (also when empty) or
	// api.PasswordLoginBreakGlass: then only BreakGlassUsers may sign in
	// with a password, and everyone else through OIDC.
	PasswordLogin   string
	BreakGlassUsers []string
	// PasswordCost is the bcrypt cost of the passwords the console stores
	// (bcrypt.DefaultCost when zero); tests lower it. No flag sets it.
	PasswordCost int
	// Limits bound the server's client connections: header and request
	// read timeouts, idle keep-alive, open connections. A zero field takes
	// serve's default (serve.DefaultRead and the others).
	Limits serve.Limits
	// PasswordChecks is how many bcrypt checks run at once
	// (store.DefaultPasswordChecks when zero).
	PasswordChecks int
	// XDSListen, when set, is the address of the xDS config server
	// (backend/xds) that feeds stock envoyproxy/ratelimit processes.
	XDSListen string
	// XDSReady, if set, is called with the xDS server's bound address
	// once it accepts connections (tests listen on :0).
	XDSReady func(net.Addr)
}

// consoleLimits is lim with serve's defaults in its zero fields.
func consoleLimits(lim serve.Limits) serve.Limits {
	or := func(d *time.Duration, def time.Duration) {
		if *d == 0 {
			*d = def
		}
	}
	or(&lim.ReadHeader, serve.DefaultReadHeader)
	or(&lim.Read, serve.DefaultRead)
	or(&lim.Idle, serve.DefaultIdle)
	if lim.MaxConns == 0 {
		lim.MaxConns = serve.DefaultMaxConns
	}
	if lim.MaxHeaderBytes == 0 {
		lim.MaxHeaderBytes = 64 << 10
	}
	return lim
}

// ssoProvider checks the sign-in configuration and builds the identity
// provider (nil when single sign-on is off).
func ssoProvider(cfg Config) (*sso.Provider, error) {
	switch cfg.PasswordLogin {
	case "", api.PasswordLoginAll:
	case api.PasswordLoginBreakGlass:
		if cfg.OIDC.Issuer == "" {
			return nil, errors.New("password login break-glass needs an OIDC issuer: otherwise only the break-glass users could sign in")
		}
		if len(cfg.BreakGlassUsers) == 0 {
			return nil, errors.New("password login break-glass needs at least one break-glass user")
		}
	default:
		return nil, fmt.Errorf("password login %q: want %s or %s", cfg.PasswordLogin, api.PasswordLoginAll, api.PasswordLoginBreakGlass)
	}
	if cfg.OIDC.Issuer == "" {
		return nil, nil
	}
	return sso.New(cfg.OIDC)
}

// counterStoreTimeout bounds each step of a support-desk call to the
// counter store: far above an enforcer's, since nobody's request waits.
const counterStoreTimeout = time.Second

// Run migrates the database, bootstraps the admin user if there are no
// users, and serves until ctx ends. ready, if set, is called with the bound
// address once the server accepts connections. Messages meant for the
// operator (a generated admin password) go to out.
func Run(ctx context.Context, cfg Config, log *slog.Logger, out io.Writer, ready func(net.Addr)) error {
	if err := api.CheckProxies(cfg.TrustedProxies); err != nil {
		return err
	}
	var counters *limiter.Redis
	if cfg.RedisURL != "" {
		client, err := limiter.NewClient(cfg.RedisURL, limiter.WithTimeout(counterStoreTimeout), limiter.WithDialTimeout(counterStoreTimeout))
		if err != nil {
			return fmt.Errorf("counter store: %w", err)
		}
		defer client.Close()
		counters = limiter.NewRedis(client)
	}
	idp, err := ssoProvider(cfg)
	if err != nil {
		return err
	}
	st, err := store.Open(ctx, cfg.DatabaseURL, store.PasswordCost(cfg.PasswordCost))
	if err != nil {
		return err
	}
	defer st.Close()
	st.SetPasswordChecks(cfg.PasswordChecks)
	if err := st.Migrate(ctx); err != nil {
		return err
	}
	if err := bootstrapAdmin(ctx, st, cfg.AdminPassword, out); err != nil {
		return err
	}
	if err := bootstrapNodeToken(ctx, st, cfg.BootstrapNodeToken, cfg.BootstrapNodeTokenFile, log, out); err != nil {
		return err
	}
	limits := consoleLimits(cfg.Limits)
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	defer ln.Close()
	publicURL := strings.TrimSuffix(cfg.PublicURL, "/")
	if publicURL == "" {
		publicURL = "http://" + ln.Addr().String()
		if a, ok := ln.Addr().(*net.TCPAddr); ok && a.IP.IsUnspecified() {
			publicURL = "http://localhost:" + strconv.Itoa(a.Port)
		}
	}

	h := hub.New(st, log)
	var xdsSrv *xds.Server
	var xdsLn net.Listener
	if cfg.XDSListen != "" {
		if xdsLn, err = net.Listen("tcp", cfg.XDSListen); err != nil {
			return fmt.Errorf("xds: listen on %s: %w", cfg.XDSListen, err)
		}
		defer xdsLn.Close()
		xdsSrv = xds.New(xds.Config{Store: st, Log: log, Console: h.ID(), StaleAfter: hub.StaleAfter})
		h.SetPushHook(xdsSrv.Push)
	}
	agg := stats.New(stats.Config{Store: st, Log: log, Replica: h.ID(),
		Retention: cfg.StatsRetention, PublicURL: publicURL, SpikeWarmup: cfg.SpikeWarmup})
	if err := agg.Load(ctx); err != nil {
		log.Warn("load live traffic; it fills as nodes report", "error", err)
	}
	h.SetStatsSink(agg)
	bgCtx, stopBackground := context.WithCancel(ctx)
	hubDone, aggDone, streamDone, xdsDone := make(chan error, 1), make(chan error, 1), make(chan struct{}), make(chan error, 1)
	go func() { hubDone <- h.Run(bgCtx) }()
	if xdsSrv != nil {
		go func() { xdsDone <- xdsSrv.Serve(bgCtx, xdsLn) }()
		log.Info("xds config server listening", "address", xdsLn.Addr().String())
		if cfg.XDSReady != nil {
			cfg.XDSReady(xdsLn.Addr())
		}
	} else {
		xdsDone <- nil
	}
	go func() { aggDone <- agg.Run(bgCtx) }()
	go func() {
		defer close(streamDone)
		auditstream.New(auditstream.Config{Store: st, Log: log}).Run(bgCtx)
	}()
	defer func() { // before st.Close: both write to Postgres one last time
		stopBackground()
		<-streamDone
		if err := <-hubDone; err != nil {
			log.Warn("node hub", "error", err)
		}
		if err := <-xdsDone; err != nil {
			log.Warn("xds config server", "error", err)
		}
		if err := <-aggDone; err != nil {
			log.Warn("stats", "error", err)
		}
	}()
	handler := api.New(api.Config{Store: st, Hub: h, Stats: agg, Log: log, UI: web.Handler(), SecureCookies: cfg.SecureCookies,
		TrustedProxies: cfg.TrustedProxies, MetricsAuth: cfg.MetricsAuth, Counters: counters, KeyPrefix: cfg.KeyPrefix,
		SSO: idp, PasswordLogin: cfg.PasswordLogin, BreakGlassUsers: cfg.BreakGlassUsers})
	if idp != nil {
		// Only a warning: sign-ins retry discovery, so a provider down now
		// does not keep the console (or password break-glass) from working.
		go func() {
			if err := idp.Discover(bgCtx); err != nil {
				log.Warn("identity provider not reachable; single sign-on retries at each sign-in", "issuer", cfg.OIDC.Issuer, "error", err)
			}
		}()
	}

	srv := serve.Server(handler, limits, log)
	srv.BaseContext = func(net.Listener) context.Context { return ctx }
	log.Info("console listening", "address", ln.Addr().String())
	if ready != nil {
		ready(ln.Addr())
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(serve.Listener(ln, limits)) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	// Node streams are hijacked connections that Shutdown does not wait for;
	// the hub closes them (going away) when it stops, right after.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("shut down: %w", err)
	}
	return nil
}

func bootstrapAdmin(ctx context.Context, st *store.Store, password string, out io.Writer) error {
	n, err := st.CountUsers(ctx)
	if err != nil || n > 0 {
		return err
	}
	generated := password == ""
	if generated {
		b := make([]byte, 18)
		rand.Read(b)
		password = base64.RawURLEncoding.EncodeToString(b)
	}
	if _, err := st.CreateUser(ctx, "admin", password, store.RoleAdmin, store.Actor{Name: "system:bootstrap"}); err != nil {
		return fmt.Errorf("create admin user: %w", err)
	}
	if generated {
		fmt.Fprintf(out, "Created user admin with password %s (shown once; set SLUICE_ADMIN_PASSWORD to choose it)\n", password)
	}
	return nil
}
