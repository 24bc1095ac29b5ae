# Helpers shared by the load scripts (source after `cd` to the checkout;
# `run` needs `D`, the seconds each load runs).

# The start every load script shares: the release binaries, built unless
# SKIP_BUILD=1 (to measure binaries kept from another commit: copy them
# into target/release), a work directory ($work), and on exit every process
# in $pids (and $server, if set) killed and $work removed.
setup() {
    [ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release --quiet --bins
    work=$(mktemp -d)
    pids=()
    trap 'for p in "${pids[@]}" ${server:-}; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT
}

# One ShouldRateLimit request for a hot key, framed for gRPC: $work/body.bin.
hot_key_body() { python3 loadtest/grpc_body.py "$work/body.bin" api remote_address=10.0.0.1; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 did not open" >&2; return 1; }
# Prints the command (with the work directory as $WORK) and runs it, bounded.
run() { echo "\$ ${*}" | sed "s|$work|\$WORK|g" >&2; timeout $((D + 20)) "$@"; }
