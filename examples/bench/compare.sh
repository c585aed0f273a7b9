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
# FLOOR=1 (the default; FLOOR=0 skips it) also measures
# examples/bench/floor, a server of the same protocol on the node's
# transports (grpc-go with its default codec, net/http with protojson) that
# answers every check OK without rules or Redis: the least CPU per check a
# server built that way can spend.
#
# FLOOR_REDIS=1 (the default when FLOOR=1) also measures "floor+redis": the
# same server taking each check's hit in Redis through the node's own
# Batcher before answering (floor -redis). The node's CPU per check over
# floor+redis's is what the engine adds to a check; floor+redis's over the
# floor's is what asking Redis costs a node.
#
# LEASE=1 also runs a second enforcer, "sluice+lease", whose limit sets
# lease: true (local leases for hot keys), measured beside the first.
#
# ASYNC=1 also runs an enforcer "sluice+async" whose limit sets
# consistency: async (counted on the node, flushed to Redis every 100 ms).
#
# PIN=1 runs the servers and Redis on CPU 0 and every load generator
# (sluice bench, h2load, redis-benchmark) on the other CPUs, with taskset:
# the load generator then takes no CPU from what it measures, and each Go
# server runs with GOMAXPROCS 1. Needs two CPUs or more.
#
# Prints one markdown row per configuration with the median of ROUNDS runs,
# including the CPU time the server, Redis and the load generator spent per
# check during the measured window (from /proc and getrusage, so Linux
# only): unlike checks/s, it hardly depends on what else the machine is
# doing.
set -euo pipefail
export LC_ALL=C # decimal points in the figures awk reads

SLUICE=${SLUICE:-}
DUR=${DUR:-5s}
WARMUP=${WARMUP:-1s}
ROUNDS=${ROUNDS:-3}
CONCURRENCY=${CONCURRENCY:-"16 64 256"}
KEYS=${KEYS:-"1 10000"}
TRANSPORTS=${TRANSPORTS:-"grpc http"}
LYFT_BIN=${LYFT_BIN:-}
FLOOR=${FLOOR:-1}
FLOOR_REDIS=${FLOOR_REDIS:-$FLOOR}
PIN=${PIN:-0}
LEASE=${LEASE:-0}
ASYNC=${ASYNC:-0}
H2LOAD=${H2LOAD-$(command -v h2load || true)}
# Binaries given by relative paths stay found from the repository's root,
# where the script builds what it needs.
if [[ -n $SLUICE ]]; then SLUICE=$(realpath "$SLUICE"); fi
if [[ -n $LYFT_BIN ]]; then LYFT_BIN=$(realpath "$LYFT_BIN"); fi
cd "$(dirname "$0")/../.."

# on_servers / on_load: the command prefixes that pin (PIN=1) or not.
on_servers=()
on_load=()
if [[ $PIN == 1 ]]; then
	ncpu=$(nproc)
	if ((ncpu < 2)); then
		echo "PIN=1 needs two CPUs or more; this machine has $ncpu" >&2
		exit 1
	fi
	on_servers=(taskset -c 0)
	on_load=(taskset -c "1-$((ncpu - 1))")
fi

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
	go build -tags=nomsgpack -o "$SLUICE" ./cmd/sluice
fi
if [[ $FLOOR == 1 || $FLOOR_REDIS == 1 ]]; then
	go build -o "$work/floor" ./examples/bench/floor
fi

read -r RP HP GP LHP LGP LDP FHP FGP EHP EGP RHP RGP AHP AGP < <(python3 -c '
import socket
ps=[]
socks=[]
for i in range(14):
    s=socket.socket(); s.bind(("127.0.0.1",0)); ps.append(s.getsockname()[1]); socks.append(s)
print(" ".join(map(str,ps)))')

wait_for() { # url
	for _ in $(seq 200); do curl -fs -o /dev/null "$1" && return 0; sleep 0.05; done
	echo "not ready: $1" >&2; return 1
}

"${on_servers[@]}" redis-server --port "$RP" --bind 127.0.0.1 --save "" --appendonly no --loglevel warning --dir "$work" >/dev/null &
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
mkdir -p "$work/state" "$work/state-lease" "$work/state-async" "$work/lyft/ratelimit/config"
snapshot() { # FILE YAML
	RULES="$2" python3 - "$1" <<'PY'
import hashlib, json, os, sys
name, yaml = "bench", os.environ["RULES"]
h = hashlib.sha256(f"{len(name)}:{name}\n{len(yaml.encode())}:{yaml}\n".encode()).hexdigest()
json.dump({"type": "snapshot", "version": 1, "checksum": h,
           "domains": [{"name": name, "yaml": yaml}], "node_count": 1}, open(sys.argv[1], "w"))
PY
}
snapshot "$work/state/snapshot.json" "$SLUICE_RULES"
snapshot "$work/state-lease/snapshot.json" "$SLUICE_RULES    lease: true
"
snapshot "$work/state-async/snapshot.json" "$SLUICE_RULES    consistency: async
"
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

"${on_servers[@]}" "$SLUICE" enforcer --console-url http://127.0.0.1:9 --node-token bench --node-id bench \
	--redis-url "redis://127.0.0.1:$RP/0" --listen "127.0.0.1:$HP" --grpc-listen "127.0.0.1:$GP" \
	--state-dir "$work/state" --log-level error 2>/dev/null &
pids+=($!)
SLUICE_PID=$!
wait_for "http://127.0.0.1:$HP/readyz"
if [[ $LEASE == 1 ]]; then
	"${on_servers[@]}" "$SLUICE" enforcer --console-url http://127.0.0.1:9 --node-token bench --node-id bench-lease \
		--redis-url "redis://127.0.0.1:$RP/0" --listen "127.0.0.1:$EHP" --grpc-listen "127.0.0.1:$EGP" \
		--state-dir "$work/state-lease" --log-level error 2>/dev/null &
	pids+=($!)
	LEASE_PID=$!
	wait_for "http://127.0.0.1:$EHP/readyz"
fi
if [[ $ASYNC == 1 ]]; then
	"${on_servers[@]}" "$SLUICE" enforcer --console-url http://127.0.0.1:9 --node-token bench --node-id bench-async \
		--redis-url "redis://127.0.0.1:$RP/0" --listen "127.0.0.1:$AHP" --grpc-listen "127.0.0.1:$AGP" \
		--state-dir "$work/state-async" --log-level error 2>/dev/null &
	pids+=($!)
	ASYNC_PID=$!
	wait_for "http://127.0.0.1:$AHP/readyz"
fi

if [[ -n $LYFT_BIN ]]; then
	USE_STATSD=false LOG_LEVEL=error REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$RP" \
		RUNTIME_ROOT="$work/lyft" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false RUNTIME_IGNOREDOTFILES=true \
		HOST=127.0.0.1 PORT="$LHP" GRPC_HOST=127.0.0.1 GRPC_PORT="$LGP" DEBUG_HOST=127.0.0.1 DEBUG_PORT="$LDP" \
		"${on_servers[@]}" "$LYFT_BIN" >/dev/null 2>&1 &
	pids+=($!)
	LYFT_PID=$!
	wait_for "http://127.0.0.1:$LHP/healthcheck"
fi

if [[ $FLOOR == 1 ]]; then
	"${on_servers[@]}" "$work/floor" -grpc "127.0.0.1:$FGP" -http "127.0.0.1:$FHP" &
	pids+=($!)
	FLOOR_PID=$!
	wait_for "http://127.0.0.1:$FHP/readyz"
fi
if [[ $FLOOR_REDIS == 1 ]]; then
	"${on_servers[@]}" "$work/floor" -grpc "127.0.0.1:$RGP" -http "127.0.0.1:$RHP" -redis "redis://127.0.0.1:$RP/0" &
	pids+=($!)
	FLOOR_REDIS_PID=$!
	wait_for "http://127.0.0.1:$RHP/readyz"
fi

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# ticks PID: the CPU time (user + system) PID has used, in clock ticks.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)

# measure SERVER_PID CMD...: runs CMD (a load that prints "checks/s p50 p99
# undecided% checks load-generator-CPU-µs/check") and prints its first four
# figures, the CPU µs per check of the server and of Redis in its measured
# window, which starts WARMUP after CMD does, and the load generator's.
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
		printf "%s %s %s %s %.1f %.1f %s %s\n", f[1], f[2], f[3], f[4], s * 1e6 / hz / n, r * 1e6 / hz / n, f[6], f[7]
	}'
}

# bench TARGET TRANSPORT KEYS C → "checks/s p50 p99 undecided% checks
# cpu-µs/check" of one `sluice bench` run.
bench() {
	local res
	if ! res=$("${on_load[@]}" "$SLUICE" bench --transport "$2" --target "$1" --keys "$3" --concurrency "$4" \
		--duration "$DUR" --warmup "$WARMUP" --key key --domain bench 2>&1); then
		echo "bench failed: $res" >&2
		return 1
	fi
	# Undecided: not decided by Redis — errors (Lyft) and over_limit
	# (Sluice, failing closed), in % of the checks answered.
	awk '/^checks\/s/ {r=$2} /^p50/ {a=$2} /^p99 / {b=$2} /^p999/ {c=$2} /^errors/ {e=$2} /^checks / {n=$2; sub(/\)/, "", $6); o=$6} /^cpu\/check/ {u=$2}
		END {printf "%s %s %s %.1f %d %s %s\n", r, a, b, n+e ? 100*(e+o)/(n+e) : 0, n, u, c}' <<<"$res"
}

# secs DURATION: a duration of sluice bench and h2load (500ms, 3s, 1m) in seconds.
secs() { awk -v d="$1" 'BEGIN {v = d + 0; if (d ~ /ms$/) v /= 1000; else if (d ~ /m$/) v *= 60; print v}'; }

# h2 BASE_URL TRANSPORT C → "checks/s p50 p99 non-200% checks cpu-µs/check"
# of one h2load run (gRPC: C streams over 4 connections; HTTP/1.1: C
# connections). h2load's CPU time is that of the whole run, warm-up
# included, counted in proportion to the measured window.
h2() {
	local args conns TIMEFORMAT='%U %S'
	if [[ $2 == grpc ]]; then
		conns=$(($3 < 4 ? $3 : 4))
		args=(-c "$conns" -m $(($3 / conns)) -d "$work/req.bin" -H 'content-type: application/grpc' -H 'te: trailers'
			"$1/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
	else
		args=(--h1 -c "$3" -d "$work/req.json" -H 'content-type: application/json' "$1/json")
	fi
	rm -f "$work/h2.log"
	{ time "${on_load[@]}" "$H2LOAD" -t 1 -D "$DUR" --warm-up-time="$WARMUP" --log-file="$work/h2.log" "${args[@]}" >"$work/h2.out" 2>&1; } 2>"$work/h2.time" || {
		echo "h2load failed: $(cat "$work/h2.out")" >&2
		return 1
	}
	local rate cpu
	rate=$(awk '/^finished in/ {print $4}' "$work/h2.out")
	cpu=$(awk -v d="$(secs "$DUR")" -v w="$(secs "$WARMUP")" '{print ($1 + $2) * d / (d + w)}' "$work/h2.time")
	# The log holds the measured window's requests (column 2: HTTP status;
	# 3: µs until the end of the response).
	awk '{print $3, ($2 == 200 ? 0 : 1)}' "$work/h2.log" | sort -n |
		awk -v r="$rate" -v cpu="$cpu" '{d[++n] = $1; bad += $2}
			END {printf "%.0f %.3f %.3f %.1f %d %.1f %.3f\n", r, d[int((n + 1) * 0.5)] / 1000, d[int(n * 0.99)] / 1000, n ? 100 * bad / n : 0, n, n ? cpu * 1e6 / n : 0, d[int(n * 0.999)] / 1000}'
}

# col N: the median of column N of stdin
col() { awk -v n="$1" '{print $n}' | median; }

echo "| callers | redis-benchmark INCR ops/s | redis-benchmark EVALSHA ops/s |"
echo "|---|---|---|"
redis-cli -p "$RP" script load "return redis.call('INCR', KEYS[1])" >"$work/sha"
for c in $CONCURRENCY; do
	incr=$("${on_load[@]}" redis-benchmark -p "$RP" -c "$c" -n 200000 -t incr -q | tr '\r' '\n' | sed -nE 's/.*: ([0-9.]+) requests per second.*/\1/p')
	eval_=$("${on_load[@]}" redis-benchmark -p "$RP" -c "$c" -n 200000 -q evalsha "$(cat "$work/sha")" 1 bench:k | tr '\r' '\n' | sed -nE 's/.*: ([0-9.]+) requests per second.*/\1/p')
	echo "| $c | $incr | $eval_ |"
done

# The servers measured: name, PID, gRPC address, HTTP address.
servers=("sluice $SLUICE_PID 127.0.0.1:$GP 127.0.0.1:$HP")
if [[ $LEASE == 1 ]]; then servers+=("sluice+lease $LEASE_PID 127.0.0.1:$EGP 127.0.0.1:$EHP"); fi
if [[ $ASYNC == 1 ]]; then servers+=("sluice+async $ASYNC_PID 127.0.0.1:$AGP 127.0.0.1:$AHP"); fi
if [[ -n $LYFT_BIN ]]; then LYFT_I=${#servers[@]}; servers+=("envoyproxy/ratelimit $LYFT_PID 127.0.0.1:$LGP 127.0.0.1:$LHP"); fi
if [[ $FLOOR == 1 ]]; then servers+=("floor $FLOOR_PID 127.0.0.1:$FGP 127.0.0.1:$FHP"); fi
if [[ $FLOOR_REDIS == 1 ]]; then servers+=("floor+redis $FLOOR_REDIS_PID 127.0.0.1:$RGP 127.0.0.1:$RHP"); fi

# table LOAD KEYS_LIST: one row per server, transport, key count and caller
# count, each the median of ROUNDS runs; the servers take turns run by run,
# so all see the same minutes of the machine. The last column is the
# server's checks/s over envoyproxy/ratelimit's.
table() {
	local load=$1 keys=$2 tr k c i name pid gaddr haddr t lyft
	echo
	echo "| server | transport | keys | callers | checks/s | p50 ms | p99 ms | p999 ms | undecided % | server CPU µs/check | Redis CPU µs/check | load generator CPU µs/check | ÷ Lyft |"
	echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
	for tr in $TRANSPORTS; do
		for k in $keys; do
			for c in $CONCURRENCY; do
				for i in "${!servers[@]}"; do : >"$work/r$i"; done
				for _ in $(seq "$ROUNDS"); do
					for i in "${!servers[@]}"; do
						read -r name pid gaddr haddr <<<"${servers[$i]}"
						if [[ $tr == grpc ]]; then t=$gaddr; else t=http://$haddr; fi
						if [[ $load == h2 ]]; then
							measure "$pid" h2 "http://${t#http://}" "$tr" "$c" >>"$work/r$i"
						else
							measure "$pid" bench "$t" "$tr" "$k" "$c" >>"$work/r$i"
						fi
					done
				done
				lyft=
				if [[ -n $LYFT_BIN ]]; then lyft=$(col 1 <"$work/r$LYFT_I"); fi
				for i in "${!servers[@]}"; do
					read -r name _ <<<"${servers[$i]}"
					local r=$work/r$i rate
					rate=$(col 1 <"$r")
					echo "| $name | $tr | $k | $c | $rate | $(col 2 <"$r") | $(col 3 <"$r") | $(col 8 <"$r") | $(col 4 <"$r") | $(col 5 <"$r") | $(col 6 <"$r") | $(col 7 <"$r") | $(awk -v a="$rate" -v b="$lyft" 'BEGIN {if (b > 0) printf "%.2f", a / b}') |"
				done
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
