#!/usr/bin/env bash
# What tracing costs per request: Tollgate (memory store, one worker,
# pinned to core 0) with --tracing off, then on (every call sampled, spans
# batched and sent over OTLP/HTTP to a port where nothing listens, so the
# exporter's work is the same but no collector competes for the CPU);
# h2load on core 1, one hot key, 64 streams, every request carrying a
# sampled `traceparent` (the worst case: every call a span). Runs
# ROUNDS rounds, alternating, and prints decisions/s and µs per request.
#   loadtest/tracing.sh
#   DURATION=5 ROUNDS=2 loadtest/tracing.sh
# Needs h2load (nghttp2-client); installs it when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
command -v h2load >/dev/null || apt_install nghttp2-client

duration=${DURATION:-8}
rounds=${ROUNDS:-3}
source loadtest/lib.sh
setup
hot_key_body
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
port=18381
run() {
    local label=$1; shift
    port=$((port + 1))
    taskset -c 0 target/release/tollgate serve --rules loadtest/rules-grpc.yaml --grpc-addr "127.0.0.1:$port" \
        --workers 1 --log-level error --watch-rules off --admin-addr 127.0.0.1:0 "$@" >/dev/null &
    pids+=($!)
    sleep 1
    local rate
    rate=$(taskset -c 1 h2load -D "$duration" --warm-up-time 2 -c 16 -m 4 -t 1 -d "$work/body.bin" \
        -H 'content-type: application/grpc' -H 'te: trailers' \
        -H 'traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' \
        "http://127.0.0.1:$port/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
        | grep -E "^finished in" | sed -E 's/.*, ([0-9.]+) req\/s.*/\1/')
    kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true; unset 'pids[-1]'
    printf '%-22s %9.0f decisions/s  %6.2f us per request (one core)\n' "$label" "$rate" \
        "$(python3 -c "print(1e6 / $rate)")"
}
for round in $(seq "$rounds"); do
    echo "round $round"
    run "tracing off"
    run "tracing on (sampled)" --tracing on --tracing-endpoint http://127.0.0.1:9 --tracing-protocol http
done
