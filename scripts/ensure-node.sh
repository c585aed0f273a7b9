#!/usr/bin/env bash
# ensure-node.sh — make sure Node.js and npm are there to build the UI (`make ui`).
# The Go build and tests never need them. Installs Debian's packages as root;
# otherwise says what to install and exits 1.
set -euo pipefail

say() { printf 'ensure-node: %s\n' "$*" >&2; }

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
		say "installing nodejs and npm (apt-get)"
		DEBIAN_FRONTEND=noninteractive apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm
	else
		say "Node.js (20.19 or newer) and npm are needed to build the UI. Install them, e.g.:"
		say "    sudo apt-get update && sudo apt-get install -y nodejs npm"
		exit 1
	fi
fi

# Vite 8 needs Node 20.19+ or 22.12+; older ones fail later with a confusing error.
version=$(node -p 'process.versions.node')
IFS=. read -r major minor _ <<<"$version"
if ((major < 20 || (major == 20 && minor < 19) || (major == 22 && minor < 12))); then
	say "Node.js $version is too old for Vite 8: install Node 20.19+ or 22.12+ (see https://nodejs.org)"
	exit 1
fi
