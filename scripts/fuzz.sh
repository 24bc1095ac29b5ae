#!/usr/bin/env bash
# The fuzzing campaign: every target under libFuzzer for SECONDS each
# (default 60). Runs on the stable toolchain here: cargo-fuzz needs nightly
# flags (-Z sanitizer), which RUSTC_BOOTSTRAP=1 unlocks on a stable rustc.
# New corpus entries stay in fuzz/corpus/<target>; a crash is copied into
# fuzz/regressions/<target>/, which `cargo test --test api fuzz_corpus` (and so
# CI) replays from then on, and the script exits non-zero.
#
#   scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
targets=(rules_file request_bytes json_body request_sequence)

if ! command -v cargo-fuzz >/dev/null; then
    echo "fuzz: installing cargo-fuzz (cargo install cargo-fuzz --locked)" >&2
    cargo install cargo-fuzz --locked
fi
export RUSTC_BOOTSTRAP=1
cd fuzz
cargo fuzz build -O

failed=0
for target in "${targets[@]}"; do
    mkdir -p "corpus/$target" "regressions/$target" "artifacts/$target"
    echo "== $target: ${seconds}s"
    log="artifacts/$target/last-run.log"
    if cargo fuzz run -O "$target" "corpus/$target" -- \
        -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=4096 \
        -print_final_stats=1 >"$log" 2>&1; then
        grep -E "DONE" "$log" | tail -n 1 || true
    else
        failed=1
        echo "fuzz: $target found a crash:" >&2
        grep -E "panicked|ERROR|SUMMARY" "$log" | head -n 5 >&2 || true
    fi
    for crash in artifacts/"$target"/crash-* artifacts/"$target"/timeout-* artifacts/"$target"/oom-*; do
        [ -e "$crash" ] || continue
        cp "$crash" "regressions/$target/"
        echo "fuzz: saved $crash as a regression input" >&2
    done
done
exit "$failed"
