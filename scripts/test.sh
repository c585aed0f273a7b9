#!/usr/bin/env bash
# test.sh — `make test`: lint, every Go test against real Postgres and Redis,
# every fuzz target for FUZZTIME (scripts/fuzz.sh), then the UI's tests
# (scripts/ui-test.sh). Postgres and Redis are up already (make's services
# target). What the UI's tests need from outside — Node.js, the npm packages,
# Chromium — is fetched in the background meanwhile: on a fresh machine that
# is minutes of network and disk, which the Go tests would otherwise wait
# behind.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
GO=${GO:-go}
MAKE=${MAKE:-make}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

say() { printf 'test: %s\n' "$*" >&2; }

(bash scripts/ensure-node.sh && "$MAKE" --no-print-directory node_modules/.installed &&
	bash scripts/ensure-chromium.sh) >"$log" 2>&1 &
uideps=$!

start=$SECONDS
"$MAKE" --no-print-directory lint
say "lint: $((SECONDS - start)) s"
start=$SECONDS
# shellcheck source=/dev/null
. ./.data/env
# Most tests wait on Postgres, Redis or a socket rather than the CPU, so
# more run at once than -parallel's default (GOMAXPROCS, 2 here): on a
# loaded 2-core machine backend/api took 39 s at 8 against 68 s at 2. Four,
# not eight: with two packages side by side, eight made the machine slow
# enough for 50 ms Redis bounds in tests to fail open. Tests that measure
# latencies or pace traffic are not parallel: no test of their own package
# runs beside them.
"$GO" test -count=1 -parallel 4 -timeout 20m ./...
say "go test: $((SECONDS - start)) s"
start=$SECONDS
GO=$GO bash scripts/fuzz.sh
say "fuzz: $((SECONDS - start)) s"

if ! wait "$uideps"; then
	cat "$log" >&2
	say "installing the UI's test tools failed (above)"
	exit 1
fi
start=$SECONDS
"$MAKE" --no-print-directory ui-test
say "ui tests: $((SECONDS - start)) s"
