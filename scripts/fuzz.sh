#!/usr/bin/env bash
# Runs every Go fuzz target of the repository (func FuzzX in a _test.go file)
# for FUZZTIME each (default 2s), one after another: a new target is run
# without editing this script, with one fuzzing worker (make test runs it
# beside the Go tests, which judge latencies). Called by `make test`; the seed corpora run
# in the ordinary `go test` too. A failing input is saved under the
# package's testdata/fuzz/FuzzX/; commit it as a regression seed.
#
# Each package's test binary is built once and then runs each of its
# targets, so a package with four targets links once, not four times. The
# coverage counters that guide the fuzzing engine (the compiler's
# -d=libfuzzer) go into the fuzzed package only, not into every package of
# the binary as `go test -fuzz` does: everything else is then the very build
# the ordinary tests use and comes from the build cache. Instrumenting all
# ~700 packages meant compiling them all a second time, two thirds of a
# fresh clone's fuzzing time; instrumenting this module's packages instead
# of the fuzzed one alone still recompiles most of the module (nearly every
# package imports rules), 95 against 59 CPU seconds for the nine binaries.
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
		echo "fuzz ./$dir: building the test binary"
		pkg=$("$GO" list "./$dir")
		# -vet=off: make lint vets every package. No DWARF (-w) and a
		# lighter GC for the compiler and linker (GOGC=400): less CPU.
		if ! GOGC=400 "$GO" test -c -vet=off -ldflags=-w -o "$bin" -gcflags="$pkg=-d=libfuzzer" "./$dir" >"$work/build.log" 2>&1; then
			cat "$work/build.log"
			status=1
			built=""
			continue
		fi
		built=$dir
		# Where go test itself keeps what the engine found, so runs build on
		# each other's corpus.
		cache="$("$GO" env GOCACHE)/fuzz/$pkg"
	fi
	echo "fuzz ./$dir $name ($FUZZTIME)"
	# A test binary runs in its package's folder, as go test runs it, so
	# testdata/fuzz seeds are found and new failing inputs land there.
	fuzz() {
		(cd "$top/$dir" && "$bin" -test.run '^$' -test.fuzz "^${name}\$" -test.fuzztime "$FUZZTIME" -test.parallel 1 \
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
