#!/usr/bin/env bash
# A screenshot of examples/grafana/tollgate.json drawn with real data:
# Tollgate on a real Redis, scraped by a real Prometheus every 2 s, under
# two minutes of scripted traffic; then every panel's queries are run
# against that Prometheus and drawn on the dashboard's grid
# (scripts/dashboard_render.py: Grafana itself is not installable here) and
# photographed by headless Chromium.
#   scripts/dashboard-screenshot.sh [OUT.png]     (default docs/dashboard.png)
#
# The timeline (seconds): 0-120 gRPC load on two domains (one in shadow
# mode), limits that refuse part of it; 10-40 64 quota (RLQS) streams;
# 50-65 Redis stopped (store errors, the breaker, failure-mode answers);
# 80 a broken rule file (a refused load), 90 the good one back. Candidate
# rules (a stricter shop limit) are watched throughout.
# Installs prometheus, redis and chromium from apt when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
out=${1:-docs/dashboard.png}
command -v prometheus >/dev/null || apt_install prometheus
command -v redis-server >/dev/null || apt_install redis-server redis-tools
browser=$(command -v chromium || true)
[ -n "$browser" ] || { apt_install chromium; browser=$(command -v chromium); }

cargo build --release --quiet --bins
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
source loadtest/lib.sh

rport=16390 gport=18091 aport=16091 pport=19091
mkdir -p "$work/rules" "$work/prometheus"
cat > "$work/rules/shop.yaml" <<'YAML'
domain: shop
descriptors:
  - key: user
    rate_limit: {name: per-user, unit: second, requests_per_unit: 10}
YAML
cat > "$work/rules/search.yaml" <<'YAML'
domain: search
descriptors:
  - key: user
    rate_limit: {name: search-per-user, unit: second, requests_per_unit: 20}
    shadow_mode: true
YAML
cp loadtest/rules-rlqs.yaml "$work/rules/rlqs.yaml"
# Candidate rules: a stricter per-user limit for the shop, watched live.
mkdir -p "$work/candidate"
cat > "$work/candidate/shop.yaml" <<'YAML'
domain: shop
descriptors:
  - key: user
    rate_limit: {name: per-user-stricter, unit: second, requests_per_unit: 5}
YAML
cat > "$work/prometheus.yml" <<YAML
global: {scrape_interval: 2s, evaluation_interval: 2s}
scrape_configs:
  - job_name: tollgate
    static_configs: [{targets: ["127.0.0.1:$aport"]}]
YAML

redis() { redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no >/dev/null & rpid=$!; pids+=($rpid); wait_port "$rport"; }
redis
target/release/tollgate serve --rules "$work/rules" --grpc-addr "127.0.0.1:$gport" \
    --admin-addr "127.0.0.1:$aport" --candidate-rules "$work/candidate" --store redis --redis-url "redis://127.0.0.1:$rport" \
    --log-level warn --watch-interval 250ms >/dev/null & pids+=($!)
wait_port "$gport"
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/prometheus" \
    --web.listen-address="127.0.0.1:$pport" --log.level=warn >/dev/null 2>&1 & pids+=($!)
wait_port "$pport"
sleep 4
start=$(date +%s)
load() { # DOMAIN KEYS SECONDS
    target/release/tollgate-load --addr "127.0.0.1:$gport" --connections 1 --streams 2 \
        --domain "$1" --key user --keys "$2" --duration "$3" --warmup 0 >/dev/null 2>&1 || true
}
echo "traffic for 120 s" >&2
(load shop 200 120) & pids+=($!)
(load search 50 120) & pids+=($!)
(sleep 10; target/release/tollgate-rlqs-load --addr "127.0.0.1:$gport" --streams 64 --buckets 10 \
    --keys 1000 --duration 30 --warmup 0 >/dev/null 2>&1 || true) & pids+=($!)
sleep 50
echo "Redis stopped for 15 s" >&2
kill "$rpid"; wait "$rpid" 2>/dev/null || true
sleep 15
redis
sleep 15
echo "a broken rule file, then the good one" >&2
cp "$work/rules/shop.yaml" "$work/shop.good"
echo "domain: shop
descriptors: [{key: user, rate_limit: {unit: fortnight, requests_per_unit: 1}}]" > "$work/rules/shop.yaml"
sleep 10
cp "$work/shop.good" "$work/rules/shop.yaml"
sleep 34
end=$(date +%s)
sleep 3
mkdir -p "$(dirname "$out")"
python3 scripts/dashboard_render.py examples/grafana/tollgate.json "http://127.0.0.1:$pport" \
    "$start" "$end" "$work/dashboard.html"
rm -f "$out"
timeout 60 "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --window-size=1520,2250 --screenshot="$(realpath -m "$out")" "file://$work/dashboard.html" 2>/dev/null
[ -s "$out" ] || { echo "Chromium wrote no screenshot" >&2; exit 1; }
echo "$out"
