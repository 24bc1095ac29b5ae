#!/usr/bin/env bash
# Instructions per request of two builds, counted by valgrind (callgrind):
# one hot key, one request at a time (h2load -c 1 -m 1, so no call carries
# two requests), on the memory store and on a Redis. Unlike requests per
# second on a shared VM (which move by 30 % between runs of one binary),
# the count is the same to within 0.1 % from run to run: a loss or a gain
# of a few percent shows. Each side serves 2,000 and then 12,000 requests;
# the difference over 10,000 is what one request costs (start-up cancels
# out). Two figures a side: the whole process, and the worker thread alone
# (the thread that serves the calls: the control runtime's timers, such as
# the Redis reset watch, run for as long as valgrind's slow run lasts, so in
# the whole-process figure they grow with the run's length, not its calls).
#   loadtest/instructions.sh DIR_A DIR_B     # each DIR holds tollgate
#   REDIS_PORT=16400 loadtest/instructions.sh A B   # a Redis already running
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
command -v h2load >/dev/null || apt_install nghttp2-client
command -v valgrind >/dev/null || apt_install valgrind
command -v redis-server >/dev/null || apt_install redis-server
[ $# -eq 2 ] || { echo "usage: loadtest/instructions.sh DIR_A DIR_B" >&2; exit 2; }
source loadtest/lib.sh
SKIP_BUILD=1
server=
setup
hot_key_body
redis_port=${REDIS_PORT:-}
if [ -z "$redis_port" ]; then
    redis_port=$(free_port)
    redis-server --port "$redis_port" --save '' --appendonly no --daemonize yes \
        --pidfile "$work/redis.pid" >/dev/null
    for _ in $(seq 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
    pids+=("$(cat "$work/redis.pid")")
fi

# Instructions of DIR's tollgate serving N requests with STORE flags.
count() {
    local dir=$1 n=$2 store=$3 port out
    redis-cli -p "$redis_port" flushall >/dev/null
    port=$(free_port)
    out="$work/callgrind.out"
    rm -f "$out"-*
    # shellcheck disable=SC2086
    valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$out" "$dir/tollgate" serve \
        --rules loadtest/rules-grpc.yaml --grpc-addr "127.0.0.1:$port" --workers 1 \
        --log-level warn --watch-rules off --admin-addr 127.0.0.1:0 $store >/dev/null 2>&1 &
    local pid=$!
    for _ in $(seq 300); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.2; done
    h2load -n "$n" -c 1 -m 1 -t 1 -d "$work/body.bin" -H 'content-type: application/grpc' -H 'te: trailers' \
        "http://127.0.0.1:$port/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" >/dev/null
    sleep 1
    kill -INT "$pid"; wait "$pid" 2>/dev/null || true
    # Whole process, then the thread that ran the RLS service's code.
    local all=0 worker=0 file n
    for file in "$out"-*; do
        n=$(sed -n 's/^summary: //p' "$file")
        all=$((all + n))
        grep -q 'RlsServer' "$file" && worker=$((worker + n))
    done
    echo "$all $worker"
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for side in "$1" "$2"; do
    echo "$side: $("$side/tollgate" --version)"
    for store in memory redis; do
        flags=; [ "$store" = redis ] && flags="--store redis --redis-url redis://127.0.0.1:$redis_port"
        read -r small small_worker < <(count "$side" 2000 "$flags")
        read -r large large_worker < <(count "$side" 12000 "$flags")
        echo "  $store store: $(( (large - small) / 10000 )) instructions per request" \
            "($(( (large_worker - small_worker) / 10000 )) on the worker thread)"
    done
done
