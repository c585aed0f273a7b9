#!/usr/bin/env bash
# test.sh — `make test`: lint (go mod tidy -diff, go vet, staticcheck), every
# Go test against real Postgres and Redis, every fuzz target for FUZZTIME
# (scripts/fuzz.sh), and the UI's tests (scripts/ui-test.sh). Postgres and
# Redis are up already (make's services target). The tests against a real
# envoyproxy/ratelimit have their own target, make test-compat (.ci/run
# runs it after this): building that binary is ~90 s of CPU on an empty
# cache.
#
# The stages overlap where one waits and another computes, and nothing is
# compiled twice:
#
#   1. go mod tidy -diff (downloading the modules), building staticcheck,
#      and fetching Node.js and the npm packages, then the UI build (vite)
#      — all at once: mostly network. Chromium is fetched after these,
#      beside what follows.
#   2. Once the UI is built: every package and test package is compiled
#      (go list -export -deps -test), so that nothing after this compiles
#      the same package twice in two processes side by side.
#   3. Side by side: go test -vet=all (every go vet analyzer, then linking
#      and running each package's tests, one package at a time);
#      staticcheck, bin/sluice and the fuzzing (scripts/fuzz.sh), at nice
#      19; svelte-check, vitest and the JS budget. The Go tests spend most
#      of their time waiting on Postgres, Redis, sockets and paced traffic
#      once their binaries are linked, so the others use the CPU they leave. The
#      Go tests skip the envoyproxy/ratelimit ones (SLUICE_COMPAT_STAGE=later):
#      make test-compat runs them.
#   4. The Playwright end-to-end suite, once the Go tests are done (both
#      judge latencies and rates).
#
# CPU it does not spend: gin's msgpack binding, which nothing here uses and
# whose codec (ugorji/go) is the slowest package of the build to compile and
# to lint, is left out (-tags=nomsgpack, in GOFLAGS for every go command
# here, so all of them share one build); test binaries are linked without
# DWARF (-ldflags=-w: stack traces need none); and the compiler, the linker
# and staticcheck run with GOGC=400 (about a sixth less CPU for memory this
# machine has; the tests themselves run with the garbage collector as
# configured: go test -exec runs them without the GOGC set here).
#
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
GO=${GO:-go}
MAKE=${MAKE:-make}
STATICCHECK=${STATICCHECK:-honnef.co/go/tools/cmd/staticcheck@v0.8.2}
export GO
# nomsgpack: see above (make exports it too). Appended, so a GOFLAGS of
# the caller's stays.
[[ ${GOFLAGS:-} == *nomsgpack* ]] || export GOFLAGS="${GOFLAGS:+$GOFLAGS }-tags=nomsgpack"
# toolgc runs a Go tool (compiler, linker, staticcheck) with a lighter GC.
toolgc() { GOGC=400 "$@"; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
total=$SECONDS

say() { printf 'test: %s\n' "$*" >&2; }

# seconds converts the "1m2.345s" of bash's times to seconds.
seconds() { awk -v t="$1" 'BEGIN { split(t, a, "m"); sub("s", "", a[2]); printf "%.0f", a[1] * 60 + a[2] }'; }

# stage NAME CMD... runs CMD with its output in $work/NAME.log, then prints
# the log and NAME's wall and CPU time. Run it in a subshell (as `( stage
# ... ) &` or `(stage ...)`), so times counts this stage's processes only.
stage() {
	local name=$1 start=$SECONDS rc=0 user sys
	shift
	"$@" >"$work/$name.log" 2>&1 || rc=$?
	# times, not $(times): a subshell's own children have used nothing.
	times >"$work/$name.times"
	read -r user sys < <(tail -n1 "$work/$name.times")
	cat "$work/$name.log" >&2
	local took="$((SECONDS - start)) s, $(($(seconds "$user") + $(seconds "$sys"))) s CPU"
	if ((rc == 0)); then
		say "$name: $took"
	else
		say "$name: FAILED (exit $rc) after $took"
	fi
	return $rc
}

failed=()
# finish NAME PID waits for a background stage.
finish() { wait "$2" || failed+=("$1"); }

uideps() {
	bash scripts/ensure-node.sh
	"$MAKE" --no-print-directory ui
}

# 1.
(stage ui-deps uideps) &
ui=$!
(stage tidy "$GO" mod tidy -diff) &
tidy=$!
(stage staticcheck-build "$GO" run "$STATICCHECK" -version) &
scbuild=$!
# backend embeds web/dist: every compile should see the built UI, or the
# packages above it are compiled twice (or, were vite writing web/dist
# meanwhile, from a half-written folder).
finish ui-deps $ui
# Only the end-to-end tests need Chromium: nothing else waits for it. (After
# ensure-node.sh, as both may run apt-get.)
(stage chromium bash scripts/ensure-chromium.sh) &
chromium=$!

# 2. go list fetches the modules it needs itself, beside tidy.
(stage compile toolgc "$GO" list -export -deps -test -f '{{with .Error}}{{.}}{{end}}' ./...) || failed+=(compile)
finish staticcheck-build $scbuild

# 3.
# shellcheck source=/dev/null
. ./.data/env
# Most tests wait on Postgres, Redis or a socket rather than the CPU, so
# more run at once than -parallel's default (GOMAXPROCS, 2 here): on a
# loaded 2-core machine backend/api took 39 s at 8 against 68 s at 2. Four,
# not eight: with two packages side by side, eight made the machine slow
# enough for 50 ms Redis bounds in tests to fail open. Tests that measure
# latencies or pace traffic are not parallel: no test of their own package
# runs beside them. -p 1: one package's tests at a time; with two side by
# side (go test's default here), on a machine slower than the one those
# bounds were set on, a 50 ms Redis bound, a keepalive and a Postgres
# connect deadline failed in three runs of three. -exec runs each test binary with GOGC as it was before
# toolgc (unset unless the caller set it).
testgc=(env -u GOGC)
[[ -n ${GOGC:-} ]] && testgc=(env "GOGC=$GOGC")
(SLUICE_COMPAT_STAGE=later stage go-test toolgc "$GO" test -vet=all -ldflags=-w -exec "${testgc[*]}" \
	-count=1 -p 1 -parallel 4 -timeout 20m ./...) &
gotest=$!
# staticcheck, the fuzzing and the build run at the lowest priority (nice
# 19): they take only the CPU the Go tests leave, so the tests' latency
# bounds (50 ms Redis timeouts, a breaker that must stay closed) hold on a
# 2-core machine while those keep both cores busy. (Not vitest: its tests
# have timeouts of their own.)
(stage staticcheck toolgc nice -n 19 "$GO" run "$STATICCHECK" ./...) &
sc=$!
(stage fuzz nice -n 19 bash scripts/fuzz.sh) &
fz=$!
(stage ui-unit bash scripts/ui-test.sh unit) &
uu=$!
# bin/sluice with make's flags (make run's binary): linked beside the rest.
(stage build nice -n 19 "$MAKE" --no-print-directory build) || failed+=(build)
finish go-test $gotest
finish chromium $chromium
# 4. The end-to-end suite (consoles and enforcers of bin/sluice in
# Chromium) once the Go tests are done: both judge latencies (a fault
# test's p99 bound of 75 ms failed with the two side by side).
(stage e2e bash scripts/ui-test.sh e2e) || failed+=(e2e)
finish staticcheck $sc
finish fuzz $fz
finish ui-unit $uu
finish tidy $tidy

if ((${#failed[@]})); then
	say "FAILED: ${failed[*]} ($((SECONDS - total)) s)"
	exit 1
fi
times >"$work/times"
read -r user sys < <(tail -n1 "$work/times")
say "all passed: $((SECONDS - total)) s, $(($(seconds "$user") + $(seconds "$sys"))) s CPU"
