#!/usr/bin/env bash
# ui-test.sh — the UI's tests, run by `make ui-test` (and so by `make test`)
# once the UI and bin/sluice are built: type checks, vitest unit tests, the
# initial-JavaScript budget, then the Playwright end-to-end suite against a
# real console and two enforcers (needs DATABASE_URL and REDIS_URL, which
# make takes from .data/env).
#
#   bash scripts/ui-test.sh        all of it
#   bash scripts/ui-test.sh unit   type checks, vitest and the budget (needs web/dist only)
#   bash scripts/ui-test.sh e2e    the end-to-end suite (needs bin/sluice)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
step=${1:-all}

if [[ $step == unit || $step == all ]]; then
	npm run --silent typecheck
	npm test
	node scripts/ui-size.mjs
fi
[[ $step == e2e || $step == all ]] || exit 0
bash scripts/ensure-chromium.sh
# Two files at a time (web/e2e/vitest.config.ts), except the staged-rollout
# spec: it judges two cohorts' 429 rates second by second, which another
# file's console and browser beside it on two cores can starve; it runs
# alone after the others.
npm run e2e -- --exclude web/e2e/rollout.e2e.ts
npm run e2e -- web/e2e/rollout.e2e.ts
