#!/usr/bin/env bash
# Redis-backed decisions through gRPC at 1, 16 and 64 concurrent streams,
# next to redis-benchmark's EVALSHA figure for the same script, in one run.
# Server and Redis share core 0; the load generator runs on core 1.
#   loadtest/redis.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
command -v h2load >/dev/null || apt_install nghttp2-client
command -v redis-server >/dev/null || apt_install redis-server redis-tools

cargo build --release --quiet --bins
work=$(mktemp -d)
cleanup() { kill "$server" "$redis" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
rport=16399
gport=18091
python3 loadtest/grpc_body.py "$work/body.bin" api remote_address=10.0.0.1
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(redis-server --version | cut -d' ' -f1-3)"

taskset -c 0 redis-server --port $rport --bind 127.0.0.1 --save '' --appendonly no --dir "$work" >/dev/null &
redis=$!
sleep 0.5
# The script Tollgate sends, assembled as src/store/redis/mod.rs does. Tollgate
# sends the numbers as one MessagePack argument, which redis-benchmark cannot
# (NUL bytes): a first line packs decimal arguments into that form (one
# cmsgpack.pack per call, a few µs, counted in the figure).
{ echo "local ALGORITHMS = {}"; cat src/store/redis/fixed_window.lua src/store/redis/sliding_window.lua \
    src/store/redis/token_bucket.lua
  echo "do local n = {} for i, v in ipairs(ARGV) do n[i] = tonumber(v) end ARGV[1] = cmsgpack.pack(n) end"
  cat src/store/redis/batch.lua; } > "$work/batch.lua"
sha=$(redis-cli -p $rport SCRIPT LOAD "$(cat "$work/batch.lua")")
now_us=$(date +%s%6N)
window=$((now_us / 60000000))
# One request of one sliding-window check (batch.lua's layout): requests,
# checks, now, 's', key 1, previous key 2, limit, window start and end (µs),
# cost, charge, '1' (enforced).
cmd=(taskset -c 1 redis-benchmark -p $rport -n 300000 -c 64 -q EVALSHA "$sha" 2
     "bench:{x}:sw:minute:$window" "bench:{x}:sw:minute:$((window - 1))"
     1 1 "$now_us" 115 1 2 4000000000 $((window * 60000000)) $(((window + 1) * 60000000)) 1 1 49)
echo "redis-benchmark: ${cmd[*]}"
"${cmd[@]}" | tr '\r' '\n' | grep -E "requests per second" | tail -1

taskset -c 0 target/release/tollgate serve --rules loadtest/rules-grpc.yaml --grpc-addr 127.0.0.1:$gport \
    --workers 1 --store redis --redis-url redis://127.0.0.1:$rport --redis-timeout 50ms --log-level warn --watch-rules off --admin-addr 127.0.0.1:0 >/dev/null &
server=$!
sleep 1
for spec in "1 1" "4 4" "16 4"; do
    set -- $spec
    streams=$(($1 * $2))
    cmd=(taskset -c 1 h2load -D 8 --warm-up-time 2 -c "$1" -m "$2" -t 1 -d "$work/body.bin"
         -H 'content-type: application/grpc' -H 'te: trailers' --log-file "$work/h2.log"
         "http://127.0.0.1:$gport/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
    rate=$(timeout 30 "${cmd[@]}" | grep -E "^finished in" | sed -E 's/.*, ([0-9.]+) req\/s.*/\1/')
    # h2load's log: start time, status, response time in microseconds.
    p99=$(awk '{print $3}' "$work/h2.log" | sort -n | awk '{a[NR]=$1} END {print a[int(NR*0.99)]}')
    p50=$(awk '{print $3}' "$work/h2.log" | sort -n | awk '{a[NR]=$1} END {print a[int(NR*0.5)]}')
    echo "gRPC via Redis, $streams streams: $rate decisions/s, p50 ${p50} us, p99 ${p99} us   (${cmd[*]})"
done
echo "redis-server CPU time (s): $(awk '{print ($14+$15)/100}' /proc/$redis/stat)"
