#!/usr/bin/env bash
# Builds Tollgate's image from ./Containerfile with buildah, on a machine
# with no image registry, writes it to .build/tollgate-image.tar (an OCI
# archive) and runs the image test (tests/operations/image.rs) against it.
#
#   ./scripts/image.sh            build, then test
#   ./scripts/image.sh --no-test  build only
#
# No registry is reachable here, so the two base images the Containerfile
# names are made locally first, under those names, and the build runs with
# --pull=never:
#   - gcr.io/distroless/cc-debian12:nonroot: from Debian bookworm's own
#     packages (glibc, libgcc, libstdc++, libssl, tzdata, netbase,
#     base-files; unpacked, no dpkg, no shell), the host's CA bundle, and
#     the users root, nobody and nonroot (65532), as distroless has them;
#   - docker.io/library/rust:1.95-slim-bookworm: a debootstrap'ed bookworm
#     with gcc and libc6-dev, and this machine's Rust toolchain under
#     /usr/local/rustup, with cargo and rustc on PATH as in the real one.
# With network access, `docker build -f Containerfile .` pulls the real ones;
# the Containerfile is the same.
#
# buildah runs with --isolation chroot and vfs storage (no overlay or user
# namespaces needed). vfs copies each layer whole: expect ~5 GB under
# /var/lib/containers. A cold build compiles Tollgate in release mode
# (minutes on 2 cores); the cargo caches make a rebuild take seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/deps.sh
. scripts/deps.sh

export BUILDAH_ISOLATION=chroot
# vfs storage: buildah 1.28 reads no STORAGE_DRIVER variable, so every call
# names it (tests/operations/image.rs does the same).
buildah() { command buildah --storage-driver vfs "$@"; }
RUNTIME_BASE=gcr.io/distroless/cc-debian12:nonroot
RUST_VERSION=1.95.0
BUILD_BASE=docker.io/library/rust:1.95-slim-bookworm
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | sed -n 1p)
COMMIT=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
IMAGE=ghcr.io/tollgate/tollgate:$VERSION
ARCHIVE=.build/tollgate-image.tar

if [ "$(id -u)" -ne 0 ]; then
    echo "image.sh: buildah's chroot isolation and vfs storage need root (sudo ./scripts/image.sh)" >&2
    exit 1
fi
command -v buildah >/dev/null || { echo "deps: installing buildah" >&2; apt_install buildah; }

has_image() { buildah inspect --type image "$1" >/dev/null 2>&1; }

# A root file system directory becomes image $1, with `buildah config` $2...
commit_rootfs() {
    local name=$1 rootfs=$2
    shift 2
    local ctr mnt
    ctr=$(buildah from scratch)
    mnt=$(buildah mount "$ctr")
    cp -a "$rootfs/." "$mnt/"
    buildah umount "$ctr" >/dev/null
    buildah config "$@" "$ctr"
    buildah commit --quiet --rm "$ctr" "$name" >/dev/null
}

make_runtime_base() {
    local work root
    work=$(mktemp -d)
    root=$work/rootfs
    mkdir -p "$root" "$work/debs"
    (cd "$work/debs" && apt-get download -qq base-files netbase tzdata libc6 libgcc-s1 \
        libstdc++6 libssl3 ca-certificates 2>/dev/null)
    for deb in "$work"/debs/*.deb; do
        [[ $deb == */ca-certificates_* ]] || dpkg-deb -x "$deb" "$root"
    done
    # Debian's CA set as update-ca-certificates bundles it (the package's
    # own bundle is made at install, which this skips). Not the host's
    # bundle: that may carry a local proxy's CA.
    dpkg-deb -x "$work"/debs/ca-certificates_*.deb "$work/ca"
    mkdir -p "$root/etc/ssl/certs"
    cat "$work"/ca/usr/share/ca-certificates/mozilla/*.crt > "$root/etc/ssl/certs/ca-certificates.crt"
    # Docs and translations, but the copyright files stay (as in distroless).
    find "$root/usr/share/doc" -type f ! -name copyright -delete
    rm -rf "$root/usr/share/man" "$root/usr/share/info" "$root/usr/share/locale" \
        "$root/usr/share/lintian" "$root/usr/share/i18n"
    # What a shell or a package manager would run: none of it is kept.
    rm -rf "$root/usr/bin" "$root/usr/sbin" "$root/sbin" "$root/bin" "$root/usr/libexec" \
        "$root/var/lib/dpkg" "$root/etc/init.d" "$root/etc/profile"* "$root/etc/skel"
    mkdir -p "$root/bin" "$root/tmp" "$root/root" "$root/home/nonroot"
    cat > "$root/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
PASSWD
    cat > "$root/etc/group" <<'GROUP'
root:x:0:
nobody:x:65534:
nonroot:x:65532:
GROUP
    chmod 1777 "$root/tmp"
    chmod 700 "$root/root" "$root/home/nonroot"
    chown 65532:65532 "$root/home/nonroot"
    commit_rootfs "$RUNTIME_BASE" "$root" \
        --env PATH=/usr/local/bin:/usr/bin:/bin --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
        --user 65532:65532 --workingdir /home/nonroot
    rm -rf "$work"
}

make_build_base() {
    local toolchain="$HOME/.rustup/toolchains/$RUST_VERSION-x86_64-unknown-linux-gnu"
    if [ ! -x "$toolchain/bin/cargo" ]; then
        echo "image.sh: the build base needs Rust $RUST_VERSION (rustup toolchain install $RUST_VERSION)" >&2
        exit 1
    fi
    command -v debootstrap >/dev/null || { echo "deps: installing debootstrap" >&2; apt_install debootstrap; }
    local work root
    work=$(mktemp -d)
    root=$work/rootfs
    echo "image.sh: debootstrap bookworm for the build base (a minute or two)" >&2
    debootstrap --variant=minbase --include=gcc,libc6-dev,ca-certificates \
        bookworm "$root" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 \
        || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
    rm -rf "$root/var/cache/apt/archives"/*.deb "$root/var/lib/apt/lists"/*
    # The build downloads crates: it trusts what this machine trusts (a
    # local proxy's CA in /usr/local/share/ca-certificates, say).
    if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
        cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
        chroot "$root" update-ca-certificates >/dev/null
    fi
    local dest="$root/usr/local/rustup/toolchains/$RUST_VERSION-x86_64-unknown-linux-gnu"
    mkdir -p "$dest" "$root/usr/local/cargo/bin"
    cp -a "$toolchain/bin" "$toolchain/lib" "$toolchain/libexec" "$dest/"
    for tool in cargo rustc rustdoc; do
        ln -s "../../rustup/toolchains/$RUST_VERSION-x86_64-unknown-linux-gnu/bin/$tool" \
            "$root/usr/local/cargo/bin/$tool"
    done
    commit_rootfs "$BUILD_BASE" "$root" \
        --env RUSTUP_HOME=/usr/local/rustup --env CARGO_HOME=/usr/local/cargo \
        --env PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env RUST_VERSION="$RUST_VERSION"
    rm -rf "$work"
}

has_image "$RUNTIME_BASE" || { echo "image.sh: making $RUNTIME_BASE locally" >&2; make_runtime_base; }
has_image "$BUILD_BASE" || { echo "image.sh: making $BUILD_BASE locally" >&2; make_build_base; }

echo "image.sh: building $IMAGE (commit $COMMIT) from Containerfile" >&2
start=$(date +%s)
buildah build --pull=never --layers -f Containerfile \
    --build-arg VERSION="$VERSION" --build-arg GIT_COMMIT="$COMMIT" \
    -t "$IMAGE" -t "localhost/tollgate:$VERSION" .
echo "image.sh: built in $(( $(date +%s) - start )) s" >&2

mkdir -p .build
rm -f "$ARCHIVE"
buildah push --quiet "$IMAGE" "oci-archive:$ARCHIVE:$IMAGE"
# sed, not head: under pipefail, head's early exit fails the pipeline (SIGPIPE).
size=$(buildah images --format '{{.Size}}' "$IMAGE" | sed -n 1p)
echo "image.sh: $IMAGE: $size uncompressed; $ARCHIVE: $(du -h "$ARCHIVE" | cut -f1)" >&2

if [ "${1:-}" != "--no-test" ]; then
    ensure_test_deps
    cargo test --test operations -- --ignored --nocapture image::
fi
