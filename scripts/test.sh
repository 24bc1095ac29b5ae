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

cargo fmt --check
cargo clippy --all-targets --quiet -- -D warnings
cargo test --no-fail-fast
