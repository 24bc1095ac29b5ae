#!/usr/bin/env bash
# The quota service (RLQS) under load, in the layout of loadtest/harness.sh
# (servers on core 0, load on core 1; DURATION seconds per run, 2 s warm-up):
#   1. usage reports per second: tollgate-rlqs-load keeps 64 streams busy,
#      each sending its next report (10 buckets over 1,000 keys) as soon as
#      the last is answered; memory store, then Redis (which the reports do
#      not wait for: Tollgate exchanges with Redis once a second per bucket);
#   2. HTTP through Envoy 1.40 (wrk, 32 connections, one API key):
#      no rate limit filter; the rate_limit_quota filter with Tollgate
#      (envoy/rlqs.yaml); the ratelimit filter calling ShouldRateLimit per
#      request (envoy/gateway.yaml, memory store). Limits are high enough that
#      every request is admitted.
#   loadtest/rlqs.sh
#   DURATION=3 loadtest/rlqs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
command -v wrk >/dev/null || apt_install wrk
command -v redis-server >/dev/null || apt_install redis-server redis-tools
ensure_envoy
ENVOY=$(envoy_bin)
D=${DURATION:-8}

source loadtest/lib.sh
setup
tollgate() { # PORT STORE-ARGS...
    local port=$1; shift
    taskset -c 0 target/release/tollgate serve --rules "$work/rules" --grpc-addr "127.0.0.1:$port" \
        --workers 1 --log-level warn --watch-rules off --admin-addr 127.0.0.1:0 "$@" >/dev/null &
    pids+=($!); wait_port "$port"
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(free -g | awk '/Mem:/ {print $2}') GiB"
echo "versions: $(target/release/tollgate --version), Envoy $("$ENVOY" --version | grep -o '1\.[0-9]*\.[0-9]*' | head -1), $(redis-server --version | cut -d' ' -f3)"
mkdir -p "$work/rules"; cp loadtest/rules.yaml loadtest/rules-rlqs.yaml "$work/rules/"

rport=$(free_port)
taskset -c 0 redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" >/dev/null &
pids+=($!); wait_port "$rport"

echo
echo "== usage reports =="
for store in memory redis; do
    gport=$(free_port)
    store_args=(--store "$store")
    [ "$store" = redis ] && store_args+=(--redis-url "redis://127.0.0.1:$rport" --redis-timeout 50ms)
    tollgate "$gport" "${store_args[@]}"
    echo "-- store: $store"
    run taskset -c 1 target/release/tollgate-rlqs-load --addr "127.0.0.1:$gport" --streams 64 \
        --buckets 10 --keys 1000 --duration "$D" --warmup 2
    kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true; unset 'pids[-1]'
done

echo
echo "== HTTP through Envoy (one API key; one Envoy at a time) =="
gport=$(free_port); tollgate "$gport"
glisten=$(free_port); gupstream=$(free_port); gadmin=$(free_port)
sed -e "s/port_value: 10000 /port_value: $glisten /" -e "s/port_value: 10001 /port_value: $gupstream /" \
    -e "s/port_value: 9901 /port_value: $gadmin /" -e "s/port_value: 8081 /port_value: $gport /" \
    envoy/gateway.yaml > "$work/gateway.yaml"
taskset -c 0 "$ENVOY" -c "$work/gateway.yaml" --concurrency 1 --disable-hot-restart --log-level error >/dev/null 2>&1 &
envoy=$!; pids+=("$envoy"); wait_port "$glisten"
echo "-- no rate limit filter (envoy/gateway.yaml, /healthz)"
run taskset -c 1 wrk -t 1 -c 32 -d "${D}s" -s loadtest/wrk_report.lua "http://127.0.0.1:$glisten/healthz" | grep -E "Requests/sec|latency us|Non-2xx"
echo "-- ratelimit filter, ShouldRateLimit per request (envoy/gateway.yaml, /items)"
run taskset -c 1 wrk -t 1 -c 32 -d "${D}s" -s loadtest/wrk_report.lua "http://127.0.0.1:$glisten/items" | grep -E "Requests/sec|latency us|Non-2xx"
kill "$envoy"; wait "$envoy" 2>/dev/null || true
listen=$(free_port); upstream=$(free_port); admin=$(free_port)
sed -e "s/port_value: 10400 /port_value: $listen /" -e "s/port_value: 10401 /port_value: $upstream /" \
    -e "s/port_value: 9905 /port_value: $admin /" -e "s/port_value: 8081 /port_value: $gport /" \
    envoy/rlqs.yaml > "$work/rlqs.yaml"
taskset -c 0 "$ENVOY" -c "$work/rlqs.yaml" --concurrency 1 --disable-hot-restart --log-level error >/dev/null 2>&1 &
pids+=($!); wait_port "$listen"
echo "-- rate_limit_quota filter, Tollgate as RLQS (envoy/rlqs.yaml)"
run taskset -c 1 wrk -t 1 -c 32 -d "${D}s" -s loadtest/wrk_report.lua -H "x-api-key: load" "http://127.0.0.1:$listen/items" | grep -E "Requests/sec|latency us|Non-2xx"
