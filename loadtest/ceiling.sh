#!/usr/bin/env bash
# Tollgate against its own ceiling, side by side in one run, same layout:
# servers (and Redis) pinned to core 0, the load generator to core 1,
# 16 connections x 4 streams (64 in flight).
#   - ceiling: target/release/tollgate-ceiling, Tollgate's HTTP/2 stack
#     answering OK without deciding anything;
#   - Tollgate on the memory store;
#   - Tollgate on Redis (standalone, on core 0 too), exact (every decision
#     in Redis) and, for the hot key, leased (loadtest/rules-grpc-leased.yaml).
# Each runs one hot key (h2load, one body) and 100,000 distinct keys
# (tollgate-load), then the ratios are printed. Last, the scaling from 1 to
# 2 workers, unpinned (load generator included), for memory and Redis.
#   loadtest/ceiling.sh                # about 3 minutes
#   DURATION=4 loadtest/ceiling.sh     # shorter runs
# Needs h2load (nghttp2-client) and redis-server; installs them when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
command -v h2load >/dev/null || apt_install nghttp2-client
command -v redis-server >/dev/null || apt_install redis-server redis-tools

duration=${DURATION:-8}
source loadtest/lib.sh
setup
hot_key_body
rport=16499
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(redis-server --version | cut -d' ' -f1-3)"
taskset -c 0 redis-server --port $rport --bind 127.0.0.1 --save '' --appendonly no --dir "$work" >/dev/null &
pids+=($!)

# hot PIN PORT: decisions/s for one hot key (h2load), with p99 in µs.
hot() {
    local pin=$1 port=$2
    taskset -c "$pin" h2load -D "$duration" --warm-up-time 2 -c 16 -m 4 -t 1 -d "$work/body.bin" \
        -H 'content-type: application/grpc' -H 'te: trailers' --log-file "$work/h2.log" \
        "http://127.0.0.1:$port/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
        | grep -E "^finished in" | sed -E 's/.*, ([0-9.]+) req\/s.*/\1/'
}
hot_p99() { awk '{print $3}' "$work/h2.log" | sort -n | awk '{a[NR]=$1} END {print a[int(NR*0.99)]}'; }
# distinct PIN PORT: "decisions/s p99" over 100,000 keys (tollgate-load).
distinct() {
    local pin=$1 port=$2 out
    out=$(taskset -c "$pin" target/release/tollgate-load --addr "127.0.0.1:$port" --connections 16 --streams 4 \
        --duration "$duration" --warmup 2 --keys 100000)
    echo "$(echo "$out" | sed -nE 's/^decisions\/s: ([0-9]+).*/\1/p') $(echo "$out" | sed -nE 's/.*p99 ([0-9]+).*/\1/p')"
}
# start PIN WORKERS PORT ARGS...: a server in the background.
start() {
    local pin=$1 workers=$2 port=$3; shift 3
    local rules=loadtest/rules-grpc.yaml
    if [ "${1:-}" = leased ]; then rules=loadtest/rules-grpc-leased.yaml; shift; fi
    if [ "${1:-}" = ceiling ]; then
        taskset -c "$pin" target/release/tollgate-ceiling --addr "127.0.0.1:$port" --workers "$workers" >/dev/null &
    else
        taskset -c "$pin" target/release/tollgate serve --rules "$rules" --grpc-addr "127.0.0.1:$port" \
            --workers "$workers" --log-level warn --watch-rules off --admin-addr 127.0.0.1:0 "$@" >/dev/null &
    fi
    pids+=($!)
    sleep 1
}
stop() { kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true; unset 'pids[-1]'; }
redis_args=(--store redis --redis-url "redis://127.0.0.1:$rport" --redis-timeout 50ms)

declare -A rate p99
port=18181
for server in ceiling memory redis; do
    port=$((port + 1))
    case $server in
        ceiling) start 0 1 $port ceiling ;;
        memory) start 0 1 $port ;;
        redis) redis-cli -p $rport FLUSHALL >/dev/null; start 0 1 $port "${redis_args[@]}" ;;
    esac
    rate[$server.hot]=$(hot 1 $port); p99[$server.hot]=$(hot_p99)
    read -r r p < <(distinct 1 $port)
    rate[$server.distinct]=$r; p99[$server.distinct]=$p
    stop
    printf '%-8s hot key %8.0f/s (p99 %5s us)   100k keys %8.0f/s (p99 %5s us)\n' "$server" \
        "${rate[$server.hot]}" "${p99[$server.hot]}" "${rate[$server.distinct]}" "${p99[$server.distinct]}"
done
ratio() { python3 -c "print(f'{$1 / $2:.2f}')"; }
echo "ratios (targets in issue 10):"
echo "  memory / ceiling   hot key   $(ratio "${rate[memory.hot]}" "${rate[ceiling.hot]}")   (>= 0.95)"
echo "  memory / ceiling   100k keys $(ratio "${rate[memory.distinct]}" "${rate[ceiling.distinct]}")   (>= 0.9)"
echo "  redis  / memory    hot key   $(ratio "${rate[redis.hot]}" "${rate[memory.hot]}")   (>= 0.75)"
echo "  redis  / memory    100k keys $(ratio "${rate[redis.distinct]}" "${rate[memory.distinct]}")   (>= 0.6)"
# The hot key again with the limit leased (the opt-in for hot keys).
port=$((port + 1))
redis-cli -p $rport FLUSHALL >/dev/null
start 0 1 $port leased "${redis_args[@]}"
rate[leased.hot]=$(hot 1 $port); p99[leased.hot]=$(hot_p99)
stop
printf 'redis, leased (lease 1,000) hot key %8.0f/s (p99 %5s us)\n' "${rate[leased.hot]}" "${p99[leased.hot]}"
echo "  leased / memory    hot key   $(ratio "${rate[leased.hot]}" "${rate[memory.hot]}")   (>= 0.75 with the opt-in lease)"

echo "scaling, unpinned, 100k keys (tollgate-load on the same 2 cores):"
for server in memory redis; do
    line="  $server:"
    for workers in 1 2; do
        port=$((port + 1))
        extra=()
        [ $server = redis ] && { redis-cli -p $rport FLUSHALL >/dev/null; extra=("${redis_args[@]}"); }
        start 0-1 $workers $port "${extra[@]}"
        read -r r _ < <(distinct 0-1 $port)
        stop
        line="$line $workers worker(s) ${r}/s;"
    done
    echo "$line"
done
