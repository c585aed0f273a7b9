# Sluice developer tasks.
#
#   make run     Postgres + Redis, build UI and binary, run everything on this machine
#   make test    lint, all Go tests against real Postgres and Redis, every fuzz target
#                for a few seconds (scripts/fuzz.sh, FUZZTIME=2s each), then the UI's tests
#   make test-quick  lint, the Go tests with -short (the slow load, soak and failover tests
#                skipped) and the UI's unit tests when node_modules is there; no browser
#   make test-compat  the console's xDS server against a real envoyproxy/ratelimit, built
#                at LYFT_VERSION into .data/lyft on first use (about 90 s on an empty cache)
#   make lint    go mod tidy -diff, go vet, staticcheck (no services needed)
#   make ui-test the UI's tests alone: svelte-check, vitest, JS budget, Playwright e2e
#   make build   UI (web/dist) + bin/sluice
#   make generate  rewrite everything made from backend/api/openapi.yaml (run after editing it)
#   make clean   remove build output (keeps node_modules and .data)
#
# scripts/services.sh finds or starts Postgres and Redis (DATABASE_URL and REDIS_URL
# win when set) and writes the URLs it settled on to .data/env, which recipes source.

SHELL := /bin/bash
export PATH := $(PATH):/usr/local/go/bin
GO ?= go
# gin's msgpack binding is left out of every build: nothing in Sluice speaks
# msgpack, and its codec (ugorji/go) is the slowest package of the build to
# compile and to lint. Appended to a GOFLAGS of the caller's.
export GOFLAGS += -tags=nomsgpack
# staticcheck 2026.2.2, pinned; `go run pkg@version` fetches it through the
# module proxy on first use and builds it with this Go.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

ENV := .data/env
UI_SOURCES := $(shell find web/src web/public -type f 2>/dev/null) web/index.html \
	package.json vite.config.ts tsconfig.json

.PHONY: all build ui run test test-quick test-compat lyft lint ui-test generate services stop-services clean clean-data

all: build

## Services ---------------------------------------------------------------------------

services:
	@bash scripts/services.sh

# Stops only the private instances that scripts/services.sh started under .data/.
stop-services:
	@bash scripts/services.sh stop

## UI (Svelte + Vite, web/src -> web/dist, embedded by web/embed.go) --------------------

ui: web/dist/index.html

# npm ci again only when the manifest or the lock file changed.
node_modules/.installed: package.json package-lock.json
	@bash scripts/ensure-node.sh
	npm ci
	@touch $@

web/dist/index.html: node_modules/.installed $(UI_SOURCES)
	npm run build

# Type checks, vitest unit tests, the initial-JS budget, and the Playwright
# end-to-end suite (headless Debian Chromium against bin/sluice console and
# enforcers on free ports, a fresh database). Screenshots: web/e2e/screenshots.
ui-test: services build
	. ./$(ENV) && bash scripts/ui-test.sh

## Generated from the OpenAPI document ------------------------------------------------

# backend/api/openapi.yaml is the one definition of the console's API. From
# it come docs/api.md (internal/apidoc), the Go client types of sluice ctl
# (internal/consoleapi, oapi-codegen) and the UI's types
# (web/src/lib/api.gen.ts, openapi-typescript); tests fail while any of them
# is stale, and every API test checks each answer against the document.
generate: node_modules/.installed
	$(GO) generate ./...
	npm run generate

## Go ----------------------------------------------------------------------------------

build: ui
	$(GO) build -o bin/sluice ./cmd/sluice

# Console on :8080, enforcer on :8081 (HTTP) and :8082 (gRPC), demo rules and demo traffic; Ctrl-C stops.
# The app uses database "sluice" on the server that services.sh settled on.
run: services build
	. ./$(ENV) && DATABASE_URL="$$APP_DATABASE_URL" exec bin/sluice dev

# go.mod and go.sum must be tidy (`-diff` prints the drift and fails), and
# go vet and staticcheck must have nothing to say.
lint:
	$(GO) mod tidy -diff
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

# lint, the Go tests, the fuzz targets and the UI's tests, overlapped where
# one waits and another computes (scripts/test.sh says how); it prints each
# stage's wall and CPU time. The Go tests need no Node; the UI's tests do
# (ensure-node.sh and ensure-chromium.sh install Node and Chromium as root).
test: services
	GO=$(GO) MAKE=$(MAKE) STATICCHECK=$(STATICCHECK) bash scripts/test.sh

# The edit loop: what `test` runs minus the fuzzing, the browser and the
# tests that skip themselves under -short (seconds of paced load each).
test-quick: lint services
	. ./$(ENV) && $(GO) test -short -count=1 -parallel 8 ./...
	@if [ -d node_modules ]; then npm test; else echo "test-quick: no node_modules: UI unit tests skipped (make ui installs them)"; fi

## envoyproxy/ratelimit compatibility ---------------------------------------------------

# envoyproxy/ratelimit's service, pinned (a commit of its main branch, as the module proxy
# serves it; BENCHMARKS.md measures the same build): backend/xds's TestLyftCompat runs it
# against the console's xDS server. Built once per version under .data/lyft.
LYFT_VERSION ?= v1.4.1-0.20260122083618-3fb702589d36
LYFT_BIN := .data/lyft/$(LYFT_VERSION)/service_cmd

$(LYFT_BIN):
	mkdir -p $(dir $@)
	GOBIN=$(abspath $(dir $@)) $(GO) install github.com/envoyproxy/ratelimit/src/service_cmd@$(LYFT_VERSION)

lyft: $(LYFT_BIN)

test-compat: services $(LYFT_BIN)
	. ./$(ENV) && SLUICE_LYFT_BIN=$(abspath $(LYFT_BIN)) $(GO) test -count=1 -run 'TestLyftCompat' ./backend/xds/

## Housekeeping ------------------------------------------------------------------------

clean:
	rm -rf bin
	find web/dist -mindepth 1 ! -name .gitkeep -delete

# Also drops the private Postgres/Redis data (only what services.sh created under .data/).
clean-data: stop-services
	rm -rf .data
