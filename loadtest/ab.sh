#!/usr/bin/env bash
# Two builds of Tollgate side by side on the memory store, in alternating
# pairs (A, B, A, B, ...) so that a drift of the machine hits both alike:
# one hot key (h2load) and 100,000 keys (tollgate-load), server pinned to
# core 0, load to core 1 (B's tollgate-load for both), each run 6 s after
# 2 s of warm-up. On a shared VM the same binary moves by 30 % between
# runs: read the pairs, not one run.
#   loadtest/ab.sh DIR_A DIR_B          # each DIR holds tollgate and tollgate-load
#   PAIRS=10 loadtest/ab.sh /tmp/before target/release
#   SERVE_ARGS="--candidate-rules loadtest/rules-grpc.yaml" loadtest/ab.sh A B   # more serve flags, both sides
#   RULES=loadtest/rules-grpc-refused.yaml loadtest/ab.sh A B                   # other rules (default rules-grpc.yaml)
#   SERVE_ARGS_B="--data-dir /tmp/ab-data" loadtest/ab.sh A A                    # one build, a flag on B's side only
#   FLUSH_REDIS_PORT=16400 SERVE_ARGS="--store redis --redis-url redis://127.0.0.1:16400" loadtest/ab.sh A B
#       # Redis emptied before each run: otherwise each run finds the keys of
#       # the runs before it (100,000 a run), and the later side pays for them
# Keep a build for later with: cp target/release/tollgate{,-load} /tmp/before/
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
command -v h2load >/dev/null || apt_install nghttp2-client
[ $# -eq 2 ] || { echo "usage: loadtest/ab.sh DIR_A DIR_B" >&2; exit 2; }
for dir in "$@"; do
    [ -x "$dir/tollgate" ] && [ -x "$dir/tollgate-load" ] || { echo "$dir: no tollgate or tollgate-load" >&2; exit 2; }
done
source loadtest/lib.sh
SKIP_BUILD=1
server=
setup
hot_key_body
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "A: $("$1/tollgate" --version)"
echo "B: $("$2/tollgate" --version)"
for i in $(seq 1 "${PAIRS:-5}"); do
    for side in A B; do
        dir=$1; [ "$side" = B ] && dir=$2
        side_args=; [ "$side" = B ] && side_args=${SERVE_ARGS_B:-}
        port=$(free_port)
        [ -n "${FLUSH_REDIS_PORT:-}" ] && redis-cli -p "$FLUSH_REDIS_PORT" flushall >/dev/null
        taskset -c 0 "$dir/tollgate" serve --rules "${RULES:-loadtest/rules-grpc.yaml}" --grpc-addr "127.0.0.1:$port" \
            --workers 1 --log-level warn --watch-rules off --admin-addr 127.0.0.1:0 ${SERVE_ARGS:-} $side_args >/dev/null 2>&1 &
        server=$!
        wait_port "$port"
        hot=$(taskset -c 1 h2load -D 6 --warm-up-time 2 -c 16 -m 4 -t 1 -d "$work/body.bin" \
            -H 'content-type: application/grpc' -H 'te: trailers' \
            "http://127.0.0.1:$port/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
            | grep -E "^finished in" | sed -E 's/.*, ([0-9.]+) req\/s.*/\1/')
        keys=$(taskset -c 1 "$2/tollgate-load" --addr "127.0.0.1:$port" --connections 16 --streams 4 \
            --duration 6 --warmup 2 --keys 100000 | sed -n 1p | grep -oE "decisions/s: [0-9]+" | grep -oE "[0-9]+")
        echo "pair $i $side: hot key ${hot%.*}/s, 100k keys $keys/s"
        kill "$server"; wait "$server" 2>/dev/null || true; server=
    done
done
