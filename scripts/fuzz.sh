#!/usr/bin/env bash
# Runs every Go fuzz target of the repository (func FuzzX in a _test.go file)
# for FUZZTIME each (default 2s), one after another: a new target is run
# without editing this script. Called by `make test`; the seed corpora run
# in the ordinary `go test` too. A failing input is saved under the
# package's testdata/fuzz/FuzzX/; commit it as a regression seed.
#
# Each package's instrumented test binary is built once (`go test -c` with
# -fuzz, which is what turns the coverage instrumentation on) and then runs
# each of its targets, so a package with four targets links once, not four
# times.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-2s}
top=$PWD
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0

# "pkg name" lines, sorted, so each package's targets are adjacent.
targets=$(grep -rHo --include='*_test.go' --exclude-dir=node_modules -E '^func Fuzz[A-Za-z0-9_]+' . |
	sed -E 's#^\./##; s#:func # #; s#^([^ ]*)/[^/ ]* #\1 #' | sort -u)

built=""
while read -r dir name; do
	[[ -n $dir ]] || continue
	bin="$work/$(echo "$dir" | tr / _).test"
	if [[ $built != "$dir" ]]; then
		echo "fuzz ./$dir: building the instrumented test binary"
		if ! "$GO" test -c -o "$bin" -fuzz "^${name}\$" "./$dir" >"$work/build.log" 2>&1; then
			cat "$work/build.log"
			status=1
			built=""
			continue
		fi
		built=$dir
		# Where go test itself keeps what the engine found, so runs build on
		# each other's corpus.
		cache="$("$GO" env GOCACHE)/fuzz/$("$GO" list "./$dir")"
	fi
	echo "fuzz ./$dir $name ($FUZZTIME)"
	# A test binary runs in its package's folder, as go test runs it, so
	# testdata/fuzz seeds are found and new failing inputs land there.
	fuzz() {
		(cd "$top/$dir" && "$bin" -test.run '^$' -test.fuzz "^${name}\$" -test.fuzztime "$FUZZTIME" \
			-test.fuzzcachedir "$cache") >"$work/out" 2>&1
	}
	if ! fuzz; then
		# go's fuzzing engine sometimes ends a run at -fuzztime with "context
		# deadline exceeded" and no failing input (seen on a loaded 2-core
		# machine): that is the tool, not the code, so run the target again.
		# A real failure says "Failing input written to ..." and is kept.
		if grep -q 'context deadline exceeded' "$work/out" && ! grep -q 'Failing input written to' "$work/out"; then
			echo "fuzz ./$dir $name: the fuzzing engine ended with \"context deadline exceeded\" and no failing input; running it again"
			fuzz && continue
		fi
		cat "$work/out"
		status=1
	fi
done <<<"$targets"
exit $status
