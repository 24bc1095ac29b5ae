# Installs the external programs the tests use, when they are missing.
# Sourced by scripts/test.sh and the bench scripts.

apt_install() {
    if [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null; then
        echo "deps: need $* (apt-get install $*), and cannot install as non-root" >&2
        return 1
    fi
    local SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    if [ -z "${DEPS_APT_UPDATED:-}" ]; then
        $SUDO apt-get update -qq
        DEPS_APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}

ensure_test_deps() {
    if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
        echo "deps: installing redis-server and redis-tools" >&2
        apt_install redis-server redis-tools
    fi
    # The Debian package starts a system Redis on 6379; the tests start their
    # own on free ports and do not need it.
}
