#!/usr/bin/env bash
# Does Redis at saturation, with no fault at all, make Tollgate fail open?
# One hot key with a limit of LIMIT per hour, h2load at 64 streams for
# DURATION seconds, Tollgate (2 workers), Redis and the load generator all
# unpinned on this machine's cores, so they compete for CPU as on a busy
# node. For each --redis-timeout in TIMEOUTS (the first, "default", passes
# none), prints the hits admitted (must be exactly LIMIT), the answers from
# the failure mode, the store timeouts and whether the circuit opened.
#   loadtest/redis-saturation.sh
#   TIMEOUTS="default 10ms" DURATION=6 LIMIT=5000 loadtest/redis-saturation.sh
#   EXTRA="--redis-probe-timeout 10ms" TIMEOUTS=10ms loadtest/redis-saturation.sh
#     (EXTRA: more serve flags for every run; this one probes as before
#     --redis-probe-timeout existed)
# Needs h2load (nghttp2-client) and redis-server; installs them when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
command -v h2load >/dev/null || apt_install nghttp2-client
command -v redis-server >/dev/null || apt_install redis-server redis-tools

duration=${DURATION:-6}
limit=${LIMIT:-5000}
timeouts=${TIMEOUTS:-default 10ms}
source loadtest/lib.sh
setup
hot_key_body
cat >"$work/rules.yaml" <<EOF
domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: $limit}
EOF
rport=16599
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(redis-server --version | cut -d' ' -f1-3)"
echo "load: h2load -c 16 -m 4 for ${duration}s on one key limited to $limit/hour; everything unpinned"
redis-server --port $rport --bind 127.0.0.1 --save '' --appendonly no --dir "$work" >/dev/null &
pids+=($!)
sleep 0.5
metric() { curl -s "http://127.0.0.1:$1/metrics" | awk -v m="$2" '$1 ~ "^"m {sum += $NF} END {printf "%d", sum}'; }
port=18281
for timeout in $timeouts; do
    port=$((port + 2))
    redis-cli -p $rport FLUSHALL >/dev/null
    args=(--store redis --redis-url "redis://127.0.0.1:$rport")
    [ "$timeout" != default ] && args+=(--redis-timeout "$timeout")
    # shellcheck disable=SC2206
    [ -n "${EXTRA:-}" ] && args+=($EXTRA)
    target/release/tollgate serve --rules "$work/rules.yaml" --grpc-addr "127.0.0.1:$port" \
        --admin-addr "127.0.0.1:$((port + 1))" --workers 2 --log-level error --watch-rules off \
        "${args[@]}" >/dev/null &
    pids+=($!)
    sleep 1
    rate=$(h2load -D "$duration" -c 16 -m 4 -t 1 -d "$work/body.bin" \
        -H 'content-type: application/grpc' -H 'te: trailers' \
        "http://127.0.0.1:$port/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
        | grep -E "^finished in" | sed -E 's/.*, ([0-9.]+) req\/s.*/\1/')
    admin=$((port + 1))
    within=$(metric $admin 'ratelimit_service_rate_limit_within_limit')
    allowed=$(metric $admin 'tollgate_failure_mode_allow_total')
    timeouts_seen=$(metric $admin 'tollgate_store_timeouts_total')
    opened=$(metric $admin 'tollgate_store_circuit_open_total')
    # within_limit counts every admitted hit, failure-mode ones included.
    admitted=$within
    verdict=exact
    [ "$admitted" -ne "$limit" ] && verdict="NOT EXACT"
    printf '%-8s %7.0f req/s  admitted %6d of %d (%s): %d by Redis, %d by the failure mode; %d timeouts, %d calls skipped by an open circuit\n' \
        "$timeout" "$rate" "$admitted" "$limit" "$verdict" "$((within - allowed))" "$allowed" "$timeouts_seen" "$opened"
    kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true; unset 'pids[-1]'
done
