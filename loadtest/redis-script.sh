#!/usr/bin/env bash
# Redis's time per call of the batch script, without Tollgate or gRPC: calls
# of 1 and 25 requests, one hot key and 100,000 distinct keys, Redis pinned
# to core 0 and the client to core 1 (loadtest/redis_script.py).
#   loadtest/redis-script.sh            # 5,000 calls per case
#   CALLS=20000 loadtest/redis-script.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
command -v redis-server >/dev/null || apt_install redis-server redis-tools
work=$(mktemp -d)
rport=16599
taskset -c 0 redis-server --port $rport --bind 127.0.0.1 --save '' --appendonly no --dir "$work" >/dev/null &
redis=$!
trap 'kill $redis 2>/dev/null || true; wait $redis 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 50); do redis-cli -p $rport PING >/dev/null 2>&1 && break; sleep 0.1; done
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(redis-server --version | cut -d' ' -f1-3)"
taskset -c 1 python3 loadtest/redis_script.py $rport "${CALLS:-5000}"
