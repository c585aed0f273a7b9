#!/usr/bin/env bash
# compare.sh — the enforcer benchmark behind BENCHMARKS.md: `sluice bench`
# against a `sluice enforcer` (gRPC and HTTP /json; 16, 64 and 256 callers;
# 1 key and 10,000 keys), beside `redis-benchmark` on the same private
# redis-server in the same run, and, when LYFT_BIN points at a built
# envoyproxy/ratelimit service_cmd, the same load against it on the same
# Redis. Everything listens on 127.0.0.1 and stops by itself.
#
#   DUR=5s ROUNDS=3 LYFT_BIN=/path/to/service_cmd bash examples/bench/compare.sh
#
# It builds ./cmd/sluice first (set SLUICE to use another binary).
#
# When h2load (Debian's nghttp2-client) is installed, the 1-key rows are also
# measured with it: an independent load generator written in C that costs
# the CPUs a few µs per check, so on a shared machine more of them go to the
# servers. It does not read gRPC trailers (a gRPC error counts as a success),
# so `sluice bench`, which checks every answer, stays the reference for the
# undecided column. H2LOAD= (empty) skips it.
#
# Prints one markdown row per configuration with the median of ROUNDS runs,
# including the CPU time the server and Redis spent per check during the
# measured window (from /proc, so Linux only): unlike checks/s, it hardly
# depends on what else the machine is doing.
set -euo pipefail

SLUICE=${SLUICE:-}
DUR=${DUR:-5s}
WARMUP=${WARMUP:-1s}
ROUNDS=${ROUNDS:-3}
CONCURRENCY=${CONCURRENCY:-"16 64 256"}
KEYS=${KEYS:-"1 10000"}
TRANSPORTS=${TRANSPORTS:-"grpc http"}
LYFT_BIN=${LYFT_BIN:-}
H2LOAD=${H2LOAD-$(command -v h2load || true)}

work=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

if [[ -z $SLUICE ]]; then
	SLUICE="$work/sluice"
	go build -o "$SLUICE" ./cmd/sluice
fi

read -r RP HP GP LHP LGP LDP < <(python3 -c '
import socket
ps=[]
socks=[]
for i in range(6):
    s=socket.socket(); s.bind(("127.0.0.1",0)); ps.append(s.getsockname()[1]); socks.append(s)
print(" ".join(map(str,ps)))')

wait_for() { # url
	for _ in $(seq 200); do curl -fs -o /dev/null "$1" && return 0; sleep 0.05; done
	echo "not ready: $1" >&2; return 1
}

redis-server --port "$RP" --bind 127.0.0.1 --save "" --appendonly no --loglevel warning --dir "$work" >/dev/null &
pids+=($!)
REDIS_PID=$!
for _ in $(seq 100); do redis-cli -p "$RP" ping >/dev/null 2>&1 && break; sleep 0.05; done

# A limit no run reaches. Sluice's copy fails closed, so a check Redis did
# not decide (a timeout on a loaded machine) shows as over_limit instead of
# a fast, uncounted OK; Lyft answers those with an error.
RULES='domain: bench
descriptors:
  - key: key
    rate_limit: {unit: second, requests_per_unit: 100000000}
'
SLUICE_RULES="$RULES    failure_mode: closed
"
# The enforcer starts from a saved snapshot (no console needed).
mkdir -p "$work/state" "$work/lyft/ratelimit/config"
RULES="$SLUICE_RULES" python3 - "$work/state/snapshot.json" <<'PY'
import hashlib, json, os, sys
name, yaml = "bench", os.environ["RULES"]
h = hashlib.sha256(f"{len(name)}:{name}\n{len(yaml.encode())}:{yaml}\n".encode()).hexdigest()
json.dump({"type": "snapshot", "version": 1, "checksum": h,
           "domains": [{"name": name, "yaml": yaml}], "node_count": 1}, open(sys.argv[1], "w"))
PY
printf '%s' "$RULES" >"$work/lyft/ratelimit/config/bench.yaml"

# h2load's request bodies: the check `sluice bench --keys 1` makes, as a
# length-prefixed gRPC message and as /json.
python3 - "$work" <<'PY'
import sys
def field(n, b): return bytes([n << 3 | 2, len(b)]) + b
entry = field(1, b"key") + field(2, b"k0")
msg = field(1, b"bench") + field(2, field(1, entry)) + bytes([3 << 3, 1])
open(sys.argv[1] + "/req.bin", "wb").write(b"\0" + len(msg).to_bytes(4, "big") + msg)
open(sys.argv[1] + "/req.json", "w").write('{"domain":"bench","descriptors":[{"entries":[{"key":"key","value":"k0"}]}],"hitsAddend":1}')
PY

"$SLUICE" enforcer --console-url http://127.0.0.1:9 --node-token bench --node-id bench \
	--redis-url "redis://127.0.0.1:$RP/0" --listen "127.0.0.1:$HP" --grpc-listen "127.0.0.1:$GP" \
	--state-dir "$work/state" --log-level error 2>/dev/null &
pids+=($!)
SLUICE_PID=$!
wait_for "http://127.0.0.1:$HP/readyz"

if [[ -n $LYFT_BIN ]]; then
	USE_STATSD=false LOG_LEVEL=error REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$RP" \
		RUNTIME_ROOT="$work/lyft" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false RUNTIME_IGNOREDOTFILES=true \
		HOST=127.0.0.1 PORT="$LHP" GRPC_HOST=127.0.0.1 GRPC_PORT="$LGP" DEBUG_HOST=127.0.0.1 DEBUG_PORT="$LDP" \
		"$LYFT_BIN" >/dev/null 2>&1 &
	pids+=($!)
	LYFT_PID=$!
	wait_for "http://127.0.0.1:$LHP/healthcheck"
fi

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# ticks PID: the CPU time (user + system) PID has used, in clock ticks.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)

# measure SERVER_PID CMD...: runs CMD (a load that prints "checks/s p50 p99
# undecided% checks") and prints its first four figures and the CPU µs per
# check of the server and of Redis in its measured window, which starts
# WARMUP after CMD does.
measure() {
	local pid=$1
	shift
	(sleep "$WARMUP" && echo "$(ticks "$pid") $(ticks "$REDIS_PID")" >"$work/t0") &
	local bg=$! out
	out=$("$@") || return 1
	wait "$bg"
	local s0 r0
	read -r s0 r0 <"$work/t0"
	awk -v o="$out" -v s="$(($(ticks "$pid") - s0))" -v r="$(($(ticks "$REDIS_PID") - r0))" -v hz="$HZ" 'BEGIN {
		split(o, f, " "); n = f[5] > 0 ? f[5] : 1
		printf "%s %s %s %s %.1f %.1f\n", f[1], f[2], f[3], f[4], s * 1e6 / hz / n, r * 1e6 / hz / n
	}'
}

# bench TARGET TRANSPORT KEYS C → "checks/s p50 p99 undecided% checks" of
# one `sluice bench` run.
bench() {
	local res
	if ! res=$("$SLUICE" bench --transport "$2" --target "$1" --keys "$3" --concurrency "$4" \
		--duration "$DUR" --warmup "$WARMUP" --key key --domain bench 2>&1); then
		echo "bench failed: $res" >&2
		return 1
	fi
	# Undecided: not decided by Redis — errors (Lyft) and over_limit
	# (Sluice, failing closed), in % of the checks answered.
	awk '/^checks\/s/ {r=$2} /^p50/ {a=$2} /^p99/ {b=$2} /^errors/ {e=$2} /^checks / {n=$2; sub(/\)/, "", $6); o=$6}
		END {printf "%s %s %s %.1f %d\n", r, a, b, n+e ? 100*(e+o)/(n+e) : 0, n}' <<<"$res"
}

# h2 BASE_URL TRANSPORT C → "checks/s p50 p99 non-200% checks" of one
# h2load run (gRPC: C streams over 4 connections; HTTP/1.1: C connections).
h2() {
	local args conns
	if [[ $2 == grpc ]]; then
		conns=$(($3 < 4 ? $3 : 4))
		args=(-c "$conns" -m $(($3 / conns)) -d "$work/req.bin" -H 'content-type: application/grpc' -H 'te: trailers'
			"$1/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
	else
		args=(--h1 -c "$3" -d "$work/req.json" -H 'content-type: application/json' "$1/json")
	fi
	rm -f "$work/h2.log"
	"$H2LOAD" -t 1 -D "$DUR" --warm-up-time="$WARMUP" --log-file="$work/h2.log" "${args[@]}" >"$work/h2.out" 2>&1 || {
		echo "h2load failed: $(cat "$work/h2.out")" >&2
		return 1
	}
	local rate
	rate=$(awk '/^finished in/ {print $4}' "$work/h2.out")
	# The log holds the measured window's requests (column 2: HTTP status;
	# 3: µs until the end of the response).
	awk '{print $3, ($2 == 200 ? 0 : 1)}' "$work/h2.log" | sort -n |
		awk -v r="$rate" '{d[++n] = $1; bad += $2}
			END {printf "%.0f %.3f %.3f %.1f %d\n", r, d[int((n + 1) * 0.5)] / 1000, d[int(n * 0.99)] / 1000, n ? 100 * bad / n : 0, n}'
}

# col N: the median of column N of stdin
col() { awk -v n="$1" '{print $n}' | median; }

echo "| callers | redis-benchmark INCR ops/s | redis-benchmark EVALSHA ops/s |"
echo "|---|---|---|"
redis-cli -p "$RP" script load "return redis.call('INCR', KEYS[1])" >"$work/sha"
for c in $CONCURRENCY; do
	incr=$(redis-benchmark -p "$RP" -c "$c" -n 200000 -t incr -q | tr '\r' '\n' | sed -nE 's/.*: ([0-9.]+) requests per second.*/\1/p')
	eval_=$(redis-benchmark -p "$RP" -c "$c" -n 200000 -q evalsha "$(cat "$work/sha")" 1 bench:k | tr '\r' '\n' | sed -nE 's/.*: ([0-9.]+) requests per second.*/\1/p')
	echo "| $c | $incr | $eval_ |"
done

# table LOAD KEYS_LIST: one row per transport, key count and caller count,
# each the median of ROUNDS runs; the servers alternate run by run, so both
# see the same minutes of the machine.
table() {
	local load=$1 keys=$2 tr k c t lt sr lr
	echo
	echo "| server | transport | keys | callers | checks/s | p50 ms | p99 ms | undecided % | server CPU µs/check | Redis CPU µs/check | Sluice ÷ Lyft |"
	echo "|---|---|---|---|---|---|---|---|---|---|---|"
	for tr in $TRANSPORTS; do
		for k in $keys; do
			for c in $CONCURRENCY; do
				if [[ $tr == grpc ]]; then t="127.0.0.1:$GP" lt="127.0.0.1:$LGP"; else t="http://127.0.0.1:$HP" lt="http://127.0.0.1:$LHP"; fi
				if [[ $load == h2 ]]; then t="http://${t#http://}" lt="http://${lt#http://}"; fi
				: >"$work/s"
				: >"$work/l"
				for _ in $(seq "$ROUNDS"); do
					if [[ $load == h2 ]]; then
						measure "$SLUICE_PID" h2 "$t" "$tr" "$c" >>"$work/s"
						if [[ -n $LYFT_BIN ]]; then measure "$LYFT_PID" h2 "$lt" "$tr" "$c" >>"$work/l"; fi
					else
						measure "$SLUICE_PID" bench "$t" "$tr" "$k" "$c" >>"$work/s"
						if [[ -n $LYFT_BIN ]]; then measure "$LYFT_PID" bench "$lt" "$tr" "$k" "$c" >>"$work/l"; fi
					fi
				done
				sr=$(col 1 <"$work/s")
				echo "| sluice | $tr | $k | $c | $sr | $(col 2 <"$work/s") | $(col 3 <"$work/s") | $(col 4 <"$work/s") | $(col 5 <"$work/s") | $(col 6 <"$work/s") | |"
				if [[ -n $LYFT_BIN ]]; then
					lr=$(col 1 <"$work/l")
					echo "| envoyproxy/ratelimit | $tr | $k | $c | $lr | $(col 2 <"$work/l") | $(col 3 <"$work/l") | $(col 4 <"$work/l") | $(col 5 <"$work/l") | $(col 6 <"$work/l") | $(awk -v a="$sr" -v b="$lr" 'BEGIN {printf "%.2f", a/b}') |"
				fi
			done
		done
	done
}

echo
echo "sluice bench:"
table bench "$KEYS"
if [[ -n $H2LOAD ]]; then
	echo
	echo "h2load, 1 key (undecided: non-200 answers):"
	table h2 1
fi
