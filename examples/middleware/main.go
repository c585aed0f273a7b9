// Command middleware is an example Go HTTP server rate-limited in process by
// Sluice: it subscribes to the console like an enforcer node, counts in the
// same Redis as the enforcers, and limits each client of the "app" domain.
//
//	SLUICE_CONSOLE_URL=http://127.0.0.1:8080 SLUICE_NODE_TOKEN=... \
//	REDIS_URL=redis://127.0.0.1:6379/0 go run ./examples/middleware
//
// With a domain like
//
//	domain: app
//	descriptors:
//	  - key: remote_address
//	    rate_limit: {unit: minute, requests_per_unit: 60, name: per-client}
//	  - key: api_key
//	    rate_limit: {unit: second, requests_per_unit: 10, name: per-key}
//
// published in the console, `curl -i localhost:8090/hello` shows the
// RateLimit headers, and the 61st request in a minute gets a 429 with a
// problem+json body.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/enforcer/middleware"
	"github.com/sluicehq/sluice/rules"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "example:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	reg := prometheus.NewRegistry()
	node, err := middleware.NewNode(middleware.NodeConfig{
		ConsoleURL: cmp.Or(os.Getenv("SLUICE_CONSOLE_URL"), "http://127.0.0.1:8080"),
		NodeToken:  os.Getenv("SLUICE_NODE_TOKEN"),
		NodeID:     "example-app",
		RedisURL:   cmp.Or(os.Getenv("REDIS_URL"), "redis://127.0.0.1:6379/0"),
		Registry:   reg,
		Log:        log,
	})
	if err != nil {
		return err
	}
	defer node.Close()

	// Each request is checked with two descriptors: the client address,
	// and, when the caller sends one, its API key. (Without Descriptors the
	// domain's request_descriptors, as published, would decide.)
	limit, err := node.Limiter(middleware.Config{
		Domain: "app",
		Descriptors: []rules.RequestDescriptor{
			{Entries: []rules.RequestEntry{{Key: "remote_address", From: rules.FromRemoteAddress}}},
			{Entries: []rules.RequestEntry{{Key: "api_key", From: rules.FromHeader, Name: "X-Api-Key"}}},
		},
	})
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.Handle("GET /hello", limit.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	})))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))

	srv := &http.Server{Addr: cmp.Or(os.Getenv("LISTEN"), ":8090"), Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go node.Run(ctx) // until ctx ends; requests pass unchecked until the first ruleset
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	log.Info("example app listening", "addr", srv.Addr)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
