#!/usr/bin/env bash
# gRPC throughput of `tollgate serve` on the memory store, measured as in the
# issues: server pinned to core 0, load on core 1.
#   loadtest/grpc.sh            # one hot key with h2load, then 100,000 keys with tollgate-load
# Needs h2load (Debian: nghttp2-client); installs it when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
command -v h2load >/dev/null || apt_install nghttp2-client

source loadtest/lib.sh
server=
setup
hot_key_body
port=18081
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
taskset -c 0 target/release/tollgate serve --rules loadtest/rules-grpc.yaml --grpc-addr 127.0.0.1:$port \
    --workers 1 --log-level warn --watch-rules off --admin-addr 127.0.0.1:0 >/dev/null &
server=$!
sleep 1
cmd=(taskset -c 1 h2load -D 8 --warm-up-time 2 -c 16 -m 4 -t 1 -d "$work/body.bin"
     -H 'content-type: application/grpc' -H 'te: trailers'
     "http://127.0.0.1:$port/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
echo "one hot key: ${cmd[*]}"
timeout 30 "${cmd[@]}" | grep -E "finished in|requests:|time for request"
cmd=(taskset -c 1 target/release/tollgate-load --addr 127.0.0.1:$port --connections 16 --streams 4 --duration 8 --warmup 2 --keys 100000)
echo "100,000 keys: ${cmd[*]}"
timeout 30 "${cmd[@]}"
