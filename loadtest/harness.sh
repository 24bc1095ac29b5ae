#!/usr/bin/env bash
# The load harness: starts Tollgate (memory, then Redis), Envoy and Redis on
# loopback and reports decisions per second and latency percentiles for
#   - gRPC straight to Tollgate: one hot key (h2load), 100,000 keys (tollgate-load);
#   - HTTP through Envoy without a rate limit call, with one (hot key), and with
#     distinct keys (100,000 users) (wrk).
# Servers (Tollgate, Envoy, Redis) share core 0; the load generator runs on core 1.
# Every run is bounded: DURATION seconds (default 8) plus a 2 s warm-up.
#   loadtest/harness.sh                # everything
#   DURATION=3 loadtest/harness.sh     # shorter runs
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
command -v h2load >/dev/null || apt_install nghttp2-client
command -v wrk >/dev/null || apt_install wrk
command -v redis-server >/dev/null || apt_install redis-server redis-tools
ensure_envoy
ENVOY=$(envoy_bin)
D=${DURATION:-8}

source loadtest/lib.sh
setup

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(free -g | awk '/Mem:/ {print $2}') GiB"
echo "versions: $(target/release/tollgate --version), Envoy $("$ENVOY" --version | grep -o '1\.[0-9]*\.[0-9]*' | head -1), $(redis-server --version | cut -d' ' -f3)"
hot_key_body
mkdir -p "$work/rules"; cp loadtest/rules.yaml loadtest/rules-grpc.yaml "$work/rules/"

rport=$(free_port)
taskset -c 0 redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" >/dev/null &
pids+=($!)
wait_port "$rport"

for store in memory redis; do
    gport=$(free_port); listen=$(free_port); upstream=$(free_port); admin=$(free_port)
    store_args=(--store "$store")
    [ "$store" = redis ] && store_args+=(--redis-url "redis://127.0.0.1:$rport" --redis-timeout 50ms)
    taskset -c 0 target/release/tollgate serve --rules "$work/rules" --grpc-addr "127.0.0.1:$gport" \
        --workers 1 --log-level warn --watch-rules off --admin-addr 127.0.0.1:0 "${store_args[@]}" >/dev/null &
    tollgate=$!; pids+=("$tollgate")
    sed -e "s/port_value: 10000 /port_value: $listen /" -e "s/port_value: 10001 /port_value: $upstream /" \
        -e "s/port_value: 9901 /port_value: $admin /" -e "s/port_value: 8081 /port_value: $gport /" \
        envoy/gateway.yaml > "$work/gateway.yaml"
    taskset -c 0 "$ENVOY" -c "$work/gateway.yaml" --concurrency 1 --disable-hot-restart --log-level error >/dev/null 2>&1 &
    envoy=$!; pids+=("$envoy")
    wait_port "$gport"; wait_port "$listen"

    echo
    echo "== store: $store =="
    echo "-- gRPC to Tollgate, one hot key"
    run taskset -c 1 h2load -D "$D" --warm-up-time 2 -c 16 -m 4 -t 1 -d "$work/body.bin" \
        -H 'content-type: application/grpc' -H 'te: trailers' --log-file "$work/h2.log" \
        "http://127.0.0.1:$gport/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" | grep -E "^finished in"
    awk '{print $3}' "$work/h2.log" | sort -n | awk '{a[NR]=$1} END {printf "latency us: p50 %d  p99 %d  p99.9 %d\n", a[int(NR*0.5)], a[int(NR*0.99)], a[int(NR*0.999)]}'
    echo "-- gRPC to Tollgate, 100,000 keys"
    run taskset -c 1 target/release/tollgate-load --addr "127.0.0.1:$gport" --connections 16 --streams 4 \
        --duration "$D" --warmup 2 --keys 100000
    echo "-- HTTP through Envoy, route without a rate limit call"
    run taskset -c 1 wrk -t 1 -c 32 -d "${D}s" -s loadtest/wrk_report.lua "http://127.0.0.1:$listen/healthz" | grep -E "Requests/sec|latency us|Non-2xx"
    echo "-- HTTP through Envoy with the rate limit filter, one hot key (anonymous, one address)"
    run taskset -c 1 wrk -t 1 -c 32 -d "${D}s" -s loadtest/wrk_report.lua "http://127.0.0.1:$listen/items" | grep -E "Requests/sec|latency us|Non-2xx"
    echo "-- HTTP through Envoy with the rate limit filter, 100,000 users in 1,000 orgs (two descriptors each)"
    run taskset -c 1 wrk -t 1 -c 32 -d "${D}s" -s loadtest/wrk_users.lua "http://127.0.0.1:$listen/items" | grep -E "Requests/sec|latency us|Non-2xx"
    kill "$envoy" "$tollgate"; wait "$envoy" "$tollgate" 2>/dev/null || true
done
