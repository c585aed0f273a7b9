#!/usr/bin/env bash
# ensure-chromium.sh — make sure Debian's Chromium is there for the UI's
# end-to-end tests (playwright-core drives it; no browser is downloaded).
# Installs it as root; otherwise says what to install and exits 1.
# CHROMIUM_PATH overrides where it is looked for (default /usr/bin/chromium).
set -euo pipefail

say() { printf 'ensure-chromium: %s\n' "$*" >&2; }
path=${CHROMIUM_PATH:-/usr/bin/chromium}

[[ -x $path ]] && exit 0
if [[ -n ${CHROMIUM_PATH:-} ]]; then
	say "CHROMIUM_PATH=$path is not an executable"
	exit 1
fi
if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
	say "installing chromium (apt-get)"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
	exit 0
fi
say "Chromium is needed for the UI tests. Install it, e.g.:"
say "    sudo apt-get update && sudo apt-get install -y chromium"
exit 1
