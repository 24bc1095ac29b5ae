# Helpers shared by the bench scripts (source after setting `work` and `D`).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 did not open" >&2; return 1; }
# Prints the command (with the work directory as $WORK) and runs it, bounded.
run() { echo "\$ ${*}" | sed "s|$work|\$WORK|g" >&2; timeout $((D + 20)) "$@"; }
