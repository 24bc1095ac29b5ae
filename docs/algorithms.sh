#!/usr/bin/env bash
# Regenerates the plots and numbers of docs/ALGORITHMS.md with `tollgate
# simulate` on the traffic files in examples/simulate/:
#   docs/algorithms.sh
# boundary.jsonl: an adversary sending 12 requests in the last second of a
#   minute and 12 in the first second of the next, every other minute;
# poisson.jsonl: one client sending at random (Poisson) at 15 per minute for
#   an hour;
# both against 10 per minute per client (examples/simulate/per-minute.yaml)
# under each algorithm.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin tollgate
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for traffic in boundary poisson; do
    target/release/tollgate simulate --rules examples/simulate/per-minute.yaml \
        --traffic "examples/simulate/$traffic.jsonl" \
        --algorithm fixed-window --algorithm sliding-window --algorithm token-bucket --algorithm sliding-log \
        --bin 500ms --out "$out/$traffic" >/dev/null 2>&1
    # The plots: half-second bins show the boundary bursts; a minute's bins
    # show the hour of Poisson traffic against the limit.
    plots="$out/$traffic"
    if [ "$traffic" = poisson ]; then
        target/release/tollgate simulate --rules examples/simulate/per-minute.yaml \
            --traffic "examples/simulate/$traffic.jsonl" \
            --algorithm fixed-window --algorithm sliding-window --algorithm token-bucket --algorithm sliding-log \
            --bin 60s --out "$out/$traffic-plots" >/dev/null 2>&1
        plots="$out/$traffic-plots"
    fi
    for alg in fixed_window sliding_window token_bucket sliding_log; do
        cp "$plots/plots/per-minute_yaml__${alg}--api_client.svg" "docs/algorithms/$traffic-$alg.svg"
    done
    echo "== $traffic.jsonl"
    # Admitted in total, and the most admitted in any 60 s (from the 0.5 s bins).
    python3 - "$out/$traffic/series.csv" <<'PY'
import csv, sys
rows = {}
for r in csv.DictReader(open(sys.argv[1])):
    rows.setdefault(r["scenario"], []).append(int(r["admitted"]))
for scenario, admitted in rows.items():
    window = 120  # 60 s of 0.5 s bins
    busiest = max(sum(admitted[i:i + window]) for i in range(max(1, len(admitted) - window + 1)))
    shortest = max(sum(admitted[i:i + 4]) for i in range(max(1, len(admitted) - 3)))
    print(f"{scenario}: admitted {sum(admitted)}, most in any 60 s {busiest}, most in any 2 s {shortest}")
PY
done
