#!/usr/bin/env bash
# vendor/h2 is the h2 crate as published on crates.io plus exactly the
# changes recorded in vendor/h2.patch (vendor/h2/TOLLGATE.md says why).
# Downloads the published crate (checked against its recorded SHA-256),
# diffs it against vendor/h2 file by file, and fails when the difference is
# not the recorded patch: a change to vendor/h2 that the patch does not
# record, or a patch that no longer describes the copy. Called by
# scripts/test.sh.
#
#   ./scripts/check-vendor.sh           check
#   ./scripts/check-vendor.sh --record  rewrite vendor/h2.patch from the copy
set -euo pipefail
cd "$(dirname "$0")/.."

NAME=h2
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' vendor/h2/Cargo.toml | sed -n 1p)
# From crates.io's index (the `cksum` of h2 0.4.20).
SHA256=7d29020232d6aa3fb1daca64c1127cf662cf97f254ae16c18c05b8ab635fc118
work=.build/vendor-check
rm -rf "$work"
mkdir -p "$work"
crate="$work/$NAME-$VERSION.crate"
curl -sSfL --retry 2 -o "$crate" "https://static.crates.io/crates/$NAME/$NAME-$VERSION.crate" || {
    echo "check-vendor: cannot download $NAME $VERSION from static.crates.io (the registry must be reachable)" >&2
    exit 1
}
echo "$SHA256  $crate" | sha256sum -c --quiet - || {
    echo "check-vendor: $crate is not the published $NAME $VERSION (SHA-256 differs)" >&2
    exit 1
}
tar xzf "$crate" -C "$work"
upstream="$work/$NAME-$VERSION"
diff_file="$work/h2.patch"
: > "$diff_file"
(cd vendor/h2 && find . -type f ! -name TOLLGATE.md | sed 's|^\./||' | LC_ALL=C sort) | while read -r f; do
    diff -u "$upstream/$f" "vendor/h2/$f" --label "a/$f" --label "b/$f" >> "$diff_file" || true
done
if [ "${1:-}" = "--record" ]; then
    cp "$diff_file" vendor/h2.patch
    echo "check-vendor: vendor/h2.patch recorded ($(grep -c '^+++ ' vendor/h2.patch) files)"
    exit 0
fi
if ! cmp -s "$diff_file" vendor/h2.patch; then
    echo "check-vendor: vendor/h2 differs from $NAME $VERSION by more or less than vendor/h2.patch:" >&2
    diff -u vendor/h2.patch "$diff_file" >&2 || true
    echo "check-vendor: record a deliberate change with ./scripts/check-vendor.sh --record" >&2
    exit 1
fi
echo "check-vendor: vendor/h2 is $NAME $VERSION plus vendor/h2.patch ($(grep -c '^+++ ' vendor/h2.patch) files changed)"
