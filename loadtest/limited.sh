#!/usr/bin/env bash
# What the view of who is limited costs under a refusal flood: one request
# body of N descriptors (DESCRIPTORS, 128 by default), every one over its
# limit after the first request, sent by h2load to a server with the view
# off (--limited-clients 0) and on (the defaults), in alternating pairs;
# server pinned to core 0, load to core 1, each run 6 s after 2 s of
# warm-up. The refusal log is at its default (info, 100 lines a second).
#   loadtest/limited.sh [DIR]          # DIR holds tollgate (default target/release)
#   DESCRIPTORS=1 PAIRS=5 loadtest/limited.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
command -v h2load >/dev/null || apt_install nghttp2-client
dir=${1:-target/release}
[ -x "$dir/tollgate" ] || { echo "$dir: no tollgate (cargo build --release)" >&2; exit 2; }
source loadtest/lib.sh
SKIP_BUILD=1
server=
setup
n=${DESCRIPTORS:-128}
descriptors=()
for i in $(seq 1 "$n"); do descriptors+=("remote_address=10.0.$((i / 256)).$((i % 256))"); done
python3 loadtest/grpc_body.py "$work/body.bin" api "${descriptors[@]}"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "binary: $("$dir/tollgate" --version); $n descriptors a request, all refused"
for i in $(seq 1 "${PAIRS:-3}"); do
    for view in off on; do
        extra=(); [ "$view" = off ] && extra=(--limited-clients 0)
        port=$(free_port)
        taskset -c 0 "$dir/tollgate" serve --rules loadtest/rules-grpc-refused.yaml --grpc-addr "127.0.0.1:$port" \
            --workers 1 --watch-rules off --admin-addr 127.0.0.1:0 "${extra[@]}" >/dev/null 2>&1 &
        server=$!
        wait_port "$port"
        rate=$(taskset -c 1 h2load -D 6 --warm-up-time 2 -c 16 -m 4 -t 1 -d "$work/body.bin" \
            -H 'content-type: application/grpc' -H 'te: trailers' \
            "http://127.0.0.1:$port/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
            | grep -E "^finished in" | sed -E 's/.*, ([0-9.]+) req\/s.*/\1/')
        echo "pair $i view $view: ${rate%.*} requests/s"
        kill "$server"; wait "$server" 2>/dev/null || true; server=
    done
done
