#!/usr/bin/env bash
# test.sh — `make test`: lint, every Go test against real Postgres and Redis,
# every fuzz target for FUZZTIME (scripts/fuzz.sh), the compatibility tests
# against a real envoyproxy/ratelimit (make test-compat), then the UI's tests
# (scripts/ui-test.sh). envoyproxy/ratelimit is built in the background from
# the start (about 90 s on an empty module cache), so that the build overlaps
# lint and the Go tests. Postgres and Redis are up already (make's services
# target). What the UI's tests need from outside — Node.js, the npm packages,
# Chromium — is fetched in the background meanwhile: on a fresh machine that
# is minutes of network and disk, which the Go tests would otherwise wait
# behind.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
GO=${GO:-go}
MAKE=${MAKE:-make}
log=$(mktemp)
lyftlog=$(mktemp)
trap 'rm -f "$log" "$lyftlog"' EXIT

say() { printf 'test: %s\n' "$*" >&2; }

(bash scripts/ensure-node.sh && "$MAKE" --no-print-directory node_modules/.installed &&
	bash scripts/ensure-chromium.sh) >"$log" 2>&1 &
uideps=$!
"$MAKE" --no-print-directory lyft >"$lyftlog" 2>&1 &
lyft=$!

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
# The envoyproxy/ratelimit tests run in their own stage, below.
SLUICE_COMPAT_STAGE=later "$GO" test -count=1 -parallel 4 -timeout 20m ./...
say "go test: $((SECONDS - start)) s"
start=$SECONDS
GO=$GO bash scripts/fuzz.sh
say "fuzz: $((SECONDS - start)) s"
start=$SECONDS
if ! wait "$lyft"; then
	cat "$lyftlog" >&2
	say "building envoyproxy/ratelimit failed (above)"
	exit 1
fi
"$MAKE" --no-print-directory test-compat
say "compat: $((SECONDS - start)) s"

if ! wait "$uideps"; then
	cat "$log" >&2
	say "installing the UI's test tools failed (above)"
	exit 1
fi
start=$SECONDS
"$MAKE" --no-print-directory ui-test
say "ui tests: $((SECONDS - start)) s"
