#!/usr/bin/env bash
# What --candidate-rules costs: `tollgate serve` (memory store, pinned to core
# 0) with and without a candidate rule set (the same rules again, so every
# request is decided twice), load on core 1, alternating twice:
#   loadtest/candidate.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
command -v h2load >/dev/null || apt_install nghttp2-client
source loadtest/lib.sh
server=
setup
hot_key_body
port=18082
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for round in 1 2; do
    for mode in without with; do
        extra=()
        [ "$mode" = with ] && extra=(--candidate-rules loadtest/rules-grpc.yaml)
        taskset -c 0 target/release/tollgate serve --rules loadtest/rules-grpc.yaml --grpc-addr 127.0.0.1:$port \
            --workers 1 --log-level warn --watch-rules off --admin-addr 127.0.0.1:0 "${extra[@]}" >/dev/null &
        server=$!
        sleep 1
        hot=$(timeout 30 taskset -c 1 h2load -D 8 --warm-up-time 2 -c 16 -m 4 -t 1 -d "$work/body.bin" \
            -H 'content-type: application/grpc' -H 'te: trailers' \
            "http://127.0.0.1:$port/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
            | grep -E "^finished in" | sed 's/.*, \([0-9.]*\) req\/s.*/\1/')
        keys=$(timeout 30 taskset -c 1 target/release/tollgate-load --addr 127.0.0.1:$port --connections 16 \
            --streams 4 --duration 8 --warmup 2 --keys 100000 | sed -n 1p)
        echo "round $round, $mode candidate rules: hot key $hot req/s; 100,000 keys: $keys"
        kill $server; wait $server 2>/dev/null || true
    done
done
