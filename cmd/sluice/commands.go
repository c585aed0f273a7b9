package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/debug"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver for migrate

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/backend/stats"
	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/enforcer"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/enforcer/middleware"
	"github.com/sluicehq/sluice/internal/serve"
	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/rules/wire"
)

const defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/sluice?sslmode=disable"

func runConsole(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var cfg backend.Config
	var logLevel string
	var printConfig bool
	fs := newFlagSet("console", getenv, stderr)
	fs.string(&cfg.Listen, "listen", "SLUICE_LISTEN", ":8080", "address to serve the API and UI on")
	fs.string(&cfg.DatabaseURL, "database-url", "DATABASE_URL", defaultDatabaseURL, "Postgres URL")
	fs.string(&cfg.AdminPassword, "admin-password", "SLUICE_ADMIN_PASSWORD", "", "password of user admin, created on a first start with no users")
	fs.stringNoFile(&cfg.BootstrapNodeToken, "bootstrap-node-token", "SLUICE_BOOTSTRAP_NODE_TOKEN", "", fmt.Sprintf("a secret (at least %d characters) to make a fleet node token of, named bootstrap, unless a token has it already", store.MinGivenSecret))
	fs.string(&cfg.BootstrapNodeTokenFile, "bootstrap-node-token-file", "SLUICE_BOOTSTRAP_NODE_TOKEN_FILE", "", "file holding the bootstrap fleet node token: --bootstrap-node-token is written to it; without that flag its secret is used, or, when the file is missing, a new fleet node token is made and written to it (0600) for enforcers to read with --node-token-file")
	fs.bool(&cfg.SecureCookies, "secure-cookies", "SLUICE_SECURE_COOKIES", false, "mark session cookies Secure (serving behind TLS)")
	var proxies string
	fs.string(&proxies, "trusted-proxies", "SLUICE_TRUSTED_PROXIES", "", "comma-separated IPs or CIDRs of reverse proxies whose X-Forwarded-For is believed")
	fs.bool(&cfg.MetricsAuth, "metrics-auth", "SLUICE_METRICS_AUTH", false, "require a viewer (or higher) session or Bearer token for /metrics (default: open, like /healthz)")
	fs.string(&cfg.PublicURL, "public-url", "SLUICE_PUBLIC_URL", "", "the console's address as users reach it, for links in alerts (default: http:// and the listen address)")
	fs.duration(&cfg.StatsRetention, "stats-retention", "SLUICE_STATS_RETENTION", stats.DefaultRetention, "how long per-minute traffic history, spikes and alert deliveries are kept")
	fs.string(&cfg.XDSListen, "xds-listen", "SLUICE_XDS_LISTEN", "", "address of the xDS config server (ADS, state of the world) that feeds stock envoyproxy/ratelimit processes with the rulesets (off when empty; clients send authorization: Bearer <node token>)")
	fs.string(&cfg.RedisURL, "redis-url", "REDIS_URL", "", "the Redis the enforcers count in, in the enforcer's --redis-url forms (Cluster and Sentinel too), for the support desk's inspect and reset (off when empty: they answer 503)")
	var sso ssoFlags
	sso.define(fs)
	fs.duration(&cfg.Limits.ReadHeader, "read-header-timeout", "SLUICE_READ_HEADER_TIMEOUT", serve.DefaultReadHeader, "how long a request's headers may take to arrive")
	fs.duration(&cfg.Limits.Read, "read-timeout", "SLUICE_READ_TIMEOUT", serve.DefaultRead, "how long a whole request, body included, may take to arrive (408 after; websockets are not bounded by it)")
	fs.duration(&cfg.Limits.Idle, "idle-timeout", "SLUICE_IDLE_TIMEOUT", serve.DefaultIdle, "how long an idle keep-alive connection stays open")
	fs.int(&cfg.Limits.MaxConns, "max-connections", "SLUICE_MAX_CONNECTIONS", serve.DefaultMaxConns, "client connections held open at once, websockets included; past it new ones wait to be accepted (keep it below the file-descriptor limit)")
	fs.int(&cfg.PasswordChecks, "max-password-checks", "SLUICE_MAX_PASSWORD_CHECKS", store.DefaultPasswordChecks(), "password checks (bcrypt) run at once; 8 per check may wait up to 2s, the rest get 503 with Retry-After")
	fs.string(&logLevel, "log-level", "SLUICE_LOG_LEVEL", "info", "debug, info, warn or error")
	fs.bool(&printConfig, "print-config", "SLUICE_PRINT_CONFIG", false, "print the effective configuration and exit")
	if err := fs.parse(args); err != nil {
		return err
	}
	if l := cfg.Limits; l.ReadHeader < 0 || l.Read < 0 || l.Idle < 0 || l.MaxConns < 0 || cfg.PasswordChecks < 0 {
		return fmt.Errorf("console: --read-header-timeout, --read-timeout, --idle-timeout, --max-connections and --max-password-checks must not be negative")
	}
	if proxies != "" {
		for _, p := range strings.Split(proxies, ",") {
			cfg.TrustedProxies = append(cfg.TrustedProxies, strings.TrimSpace(p))
		}
	}
	if err := sso.apply(&cfg); err != nil {
		return fmt.Errorf("console: %w", err)
	}
	if printConfig {
		pw := ""
		if cfg.AdminPassword != "" {
			pw = "xxxxx"
		}
		fmt.Fprintf(stdout, "listen=%s\ndatabase_url=%s\nadmin_password=%s\nsecure_cookies=%t\ntrusted_proxies=%s\nmetrics_auth=%t\npublic_url=%s\nstats_retention=%s\nxds_listen=%s\nredis_url=%s\nlog_level=%s\n",
			cfg.Listen, redact(cfg.DatabaseURL), pw, cfg.SecureCookies, proxies, cfg.MetricsAuth, cfg.PublicURL, cfg.StatsRetention, cfg.XDSListen, redact(cfg.RedisURL), logLevel)
		bootTok := ""
		if cfg.BootstrapNodeToken != "" {
			bootTok = "xxxxx"
		}
		fmt.Fprintf(stdout, "bootstrap_node_token=%s\nbootstrap_node_token_file=%s\n", bootTok, cfg.BootstrapNodeTokenFile)
		sso.print(stdout, cfg)
		fmt.Fprintf(stdout, "read_header_timeout=%s\nread_timeout=%s\nidle_timeout=%s\nmax_connections=%d\nmax_password_checks=%d\n",
			cfg.Limits.ReadHeader, cfg.Limits.Read, cfg.Limits.Idle, cfg.Limits.MaxConns, cfg.PasswordChecks)
		return nil
	}
	log, err := newLogger(logLevel, stderr)
	if err != nil {
		return err
	}
	return backend.Run(ctx, cfg, log, stdout, nil)
}

func enforcerFlags(fs *flagSet, cfg *enforcer.Config, nodeTokenFile *string) {
	fs.string(&cfg.ConsoleURL, "console-url", "SLUICE_CONSOLE_URL", "http://127.0.0.1:8080", "console base URL; several replicas: comma-separated URLs, tried in order")
	fs.stringNoFile(&cfg.NodeToken, "node-token", "SLUICE_NODE_TOKEN", "", "API token with role node")
	fs.string(nodeTokenFile, "node-token-file", "SLUICE_NODE_TOKEN_FILE", "", "file holding the node token, instead of --node-token; the enforcer waits for it to appear (a token the console's --bootstrap-node-token-file writes)")
	host, _ := os.Hostname()
	fs.string(&cfg.NodeID, "node-id", "SLUICE_NODE_ID", host, "this node's id, unique among enforcers")
	fs.string(&cfg.RedisURL, "redis-url", "REDIS_URL", "redis://127.0.0.1:6379/0", "redis://host:port/db; host:port,host:port or redis+cluster://... for Redis Cluster; redis+sentinel://s1:p1,s2:p2/MASTER for Sentinel; go-redis query options (pool_size, protocol=3, ...) apply")
	fs.string(&cfg.HTTPAddr, "listen", "SLUICE_LISTEN", ":8081", "HTTP check API address")
	fs.string(&cfg.GRPCAddr, "grpc-listen", "SLUICE_GRPC_LISTEN", ":8082", "gRPC rate limit service address")
	fs.string(&cfg.StateDir, "state-dir", "SLUICE_STATE_DIR", "/var/lib/sluice", "directory for the last-known-good ruleset")
}

// gatewayFlags are the enforcer's gateway-mode flags.
func gatewayFlags(fs *flagSet, cfg *enforcer.Config, trusted *string) {
	fs.string(&cfg.GatewayAddr, "gateway-listen", "SLUICE_GATEWAY_LISTEN", "", "gateway mode: address of a rate-limiting reverse proxy (off when empty)")
	fs.string(&cfg.GatewayUpstream, "gateway-upstream", "SLUICE_GATEWAY_UPSTREAM", "", "gateway mode: upstream base URL (http:// or https://)")
	fs.string(&cfg.GatewayDomain, "gateway-domain", "SLUICE_GATEWAY_DOMAIN", "", "gateway mode: rules domain whose request_descriptors and limits apply")
	fs.string(trusted, "gateway-trusted-proxies", "SLUICE_GATEWAY_TRUSTED_PROXIES", "", "gateway mode: comma-separated CIDRs of proxies whose X-Forwarded-For is believed")
}

// enforcerGCPercent is the enforcer's GOGC unless the environment sets one.
const enforcerGCPercent = 400

func runEnforcer(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var cfg enforcer.Config
	var logLevel, labels, trusted, storeTimeout, asyncFlush, globalInterval, nodeTokenFile string
	var printConfig bool
	fs := newFlagSet("enforcer", getenv, stderr)
	enforcerFlags(fs, &cfg, &nodeTokenFile)
	gatewayFlags(fs, &cfg, &trusted)
	fs.string(&storeTimeout, "redis-timeout", "SLUICE_REDIS_TIMEOUT", "50ms", "bound on each step (dial, pool wait, write, read) of a check's Redis call; past it the limit's failure_mode answers")
	fs.string(&asyncFlush, "async-flush-interval", "SLUICE_ASYNC_FLUSH_INTERVAL", "100ms", "how often the hits of consistency: async limits near their limit are sent to Redis (10ms to 10s; keys far from it send theirs once their share fills or within 10 s)")
	fs.string(&labels, "labels", "SLUICE_LABELS", "", "node labels as k=v,k=v")
	fs.string(&cfg.Region, "region", "SLUICE_REGION", "", "this node's region, when enforcers run in several regions each with its own Redis (letters, digits, - _ .)")
	fs.string(&cfg.GlobalRedisURL, "global-redis-url", "SLUICE_GLOBAL_REDIS_URL", "", "the store the regions exchange their counts of scope: global limits through (needs --region); same forms as --redis-url")
	fs.string(&globalInterval, "global-sync-interval", "SLUICE_GLOBAL_SYNC_INTERVAL", "100ms", "how often the node exchanges counts of scope: global limits with the global store")
	fs.string(&logLevel, "log-level", "SLUICE_LOG_LEVEL", "info", "debug, info, warn or error")
	fs.bool(&printConfig, "print-config", "SLUICE_PRINT_CONFIG", false, "print the effective configuration and exit")
	// File mode (the Lyft drop-in): rules from a directory, no console.
	fs.string(&cfg.RulesDir, "rules-dir", "SLUICE_RULES_DIR", "", "file mode: run without a console on the domain files (*.yaml, Lyft's format) in this directory, reloaded when they change, all or nothing; "+
		"a file without default_algorithm counts in fixed windows, as Lyft does")
	if err := fs.parse(args); err != nil {
		return err
	}
	var err error
	if cfg.RulesDir != "" {
		consoleSet := getenv("SLUICE_CONSOLE_URL") != "" || getenv("SLUICE_CONSOLE_URL_FILE") != ""
		fs.Visit(func(f *flag.Flag) { consoleSet = consoleSet || f.Name == "console-url" })
		if consoleSet {
			return fmt.Errorf("enforcer: --rules-dir (SLUICE_RULES_DIR) and --console-url (SLUICE_CONSOLE_URL) are mutually exclusive: file mode takes the rules from the directory, without a console")
		}
		cfg.ConsoleURL = ""
	}
	if cfg.Labels, err = parseLabels(labels); err != nil {
		return err
	}
	if cfg.StoreTimeout, err = time.ParseDuration(storeTimeout); err != nil || cfg.StoreTimeout <= 0 {
		return fmt.Errorf("enforcer: --redis-timeout %q: want a positive duration like 50ms", storeTimeout)
	}
	if cfg.AsyncFlushInterval, err = time.ParseDuration(asyncFlush); err != nil || cfg.AsyncFlushInterval < 10*time.Millisecond || cfg.AsyncFlushInterval > 10*time.Second {
		return fmt.Errorf("enforcer: --async-flush-interval %q: want a duration from 10ms to 10s", asyncFlush)
	}
	if cfg.GlobalInterval, err = time.ParseDuration(globalInterval); err != nil || cfg.GlobalInterval <= 0 {
		return fmt.Errorf("enforcer: --global-sync-interval %q: want a positive duration like 100ms", globalInterval)
	}
	if cfg.GlobalRedisURL != "" && cfg.Region == "" {
		return fmt.Errorf("enforcer: --global-redis-url (SLUICE_GLOBAL_REDIS_URL) needs --region (SLUICE_REGION): the name of this node's region")
	}
	if cfg.GatewayTrustedProxies, err = middleware.ParseTrustedProxies(trusted); err != nil {
		return fmt.Errorf("enforcer: --gateway-trusted-proxies: %w", err)
	}
	if cfg.GatewayAddr != "" && (cfg.GatewayUpstream == "" || cfg.GatewayDomain == "") {
		return fmt.Errorf("enforcer: --gateway-listen needs --gateway-upstream and --gateway-domain")
	}
	cfg.Build = buildVersion()
	if printConfig {
		tok := ""
		if cfg.NodeToken != "" {
			tok = "xxxxx"
		}
		fmt.Fprintf(stdout, "console_url=%s\nnode_token=%s\nnode_token_file=%s\nnode_id=%s\nredis_url=%s\nlisten=%s\ngrpc_listen=%s\nstate_dir=%s\nlabels=%s\n",
			cfg.ConsoleURL, tok, nodeTokenFile, cfg.NodeID, redact(cfg.RedisURL), cfg.HTTPAddr, cfg.GRPCAddr, cfg.StateDir, labels)
		fmt.Fprintf(stdout, "redis_timeout=%s\ngateway_listen=%s\ngateway_upstream=%s\ngateway_domain=%s\ngateway_trusted_proxies=%s\n",
			cfg.StoreTimeout, cfg.GatewayAddr, redact(cfg.GatewayUpstream), cfg.GatewayDomain, trusted)
		fmt.Fprintf(stdout, "rules_dir=%s\nasync_flush_interval=%s\n", cfg.RulesDir, cfg.AsyncFlushInterval)
		fmt.Fprintf(stdout, "region=%s\nglobal_redis_url=%s\nglobal_sync_interval=%s\n", cfg.Region, redact(cfg.GlobalRedisURL), cfg.GlobalInterval)
		return nil
	}
	if cfg.NodeToken != "" && nodeTokenFile != "" {
		return fmt.Errorf("enforcer: --node-token (SLUICE_NODE_TOKEN) and --node-token-file (SLUICE_NODE_TOKEN_FILE) are mutually exclusive")
	}
	if cfg.NodeToken == "" && nodeTokenFile == "" && cfg.RulesDir == "" {
		return fmt.Errorf("enforcer: --node-token (SLUICE_NODE_TOKEN) or --node-token-file (SLUICE_NODE_TOKEN_FILE) is required: create a token with POST /api/v1/tokens {\"name\":...,\"role\":\"node\"}")
	}
	if cfg.NodeID == "" {
		return fmt.Errorf("enforcer: --node-id (SLUICE_NODE_ID) is required")
	}
	log, err := newLogger(logLevel, stderr)
	if err != nil {
		return err
	}
	if nodeTokenFile != "" && cfg.RulesDir == "" {
		if cfg.NodeToken, err = waitForSecretFile(ctx, nodeTokenFile, log); err != nil {
			return fmt.Errorf("enforcer: --node-token-file: %w", err)
		}
		if cfg.NodeToken == "" { // ctx ended while waiting
			return nil
		}
	}
	limiter.SetLogger(log) // go-redis logs through a process-wide logger
	if getenv("GOGC") == "" {
		// A node's live heap is small (the ruleset and some buffers), so at
		// Go's default of 100 the collector runs every few MB of per-check
		// garbage. 400 costs tens of MB and saves a fifth of the CPU per
		// check (BENCHMARKS.md). GOGC, when set, is the runtime's as usual.
		debug.SetGCPercent(enforcerGCPercent)
	}
	return enforcer.Run(ctx, cfg, log, nil)
}

// parseLabels reads --labels (k=v,k=v); a bad label is an error naming it,
// so a node never starts with labels no rollout could select.
func parseLabels(s string) (map[string]string, error) {
	m, err := wire.ParseLabels(s)
	if err != nil {
		return nil, fmt.Errorf("enforcer: --labels (SLUICE_LABELS): %w", err)
	}
	return m, nil
}

func runMigrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var url string
	fs := newFlagSet("migrate", getenv, stderr)
	fs.string(&url, "database-url", "DATABASE_URL", defaultDatabaseURL, "Postgres URL")
	if err := fs.parse(args); err != nil {
		return err
	}
	db, err := sql.Open("pgx", url)
	if err != nil {
		return fmt.Errorf("open database: %w", err)
	}
	defer db.Close()
	if err := migrations.Up(ctx, db); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "database migrated")
	return nil
}

// listenAddr renders a bound address for people: ":8080" → "localhost:8080".
func listenAddr(a net.Addr) string {
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	if host == "" || host == "::" || host == "0.0.0.0" {
		host = "localhost"
	}
	return net.JoinHostPort(host, port)
}
