#!/usr/bin/env bash
# ui-test.sh — the UI's tests, run by `make ui-test` (and so by `make test`)
# once the UI and bin/sluice are built: type checks, vitest unit tests, the
# initial-JavaScript budget, then the Playwright end-to-end suite against a
# real console and two enforcers (needs DATABASE_URL and REDIS_URL, which
# make takes from .data/env).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/ensure-chromium.sh
npm run --silent typecheck
npm test
node scripts/ui-size.mjs
npm run e2e
