"""Redis's own time per call of Tollgate's batch script (INFO commandstats),
for calls of 1 and 25 requests on one hot key and on 100,000 distinct keys
(written once before the measured calls),
sent the way Tollgate sends them (each key once in KEYS, the numbers as one
MessagePack argument; see src/store/redis/batch.lua). Python's standard
library only: a plain RESP client, one call at a time.

usage: python3 loadtest/redis_script.py PORT [CALLS]
"""
import socket
import struct
import sys
import time
from pathlib import Path

LUA = Path(__file__).resolve().parent.parent / "src" / "store" / "redis"


def script():
    # As src/store/redis/mod.rs assembles it.
    parts = [(LUA / f"{name}.lua").read_text() for name in ("fixed_window", "sliding_window", "token_bucket", "batch")]
    return "local ALGORITHMS = {}\n" + "".join(parts)


class Redis:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.file = self.sock.makefile("rb")

    def call(self, *args):
        out = b"*%d\r\n" % len(args)
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        self.sock.sendall(out)
        return self.read()

    def read(self):
        line = self.file.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind in (b"+", b":"):
            return rest
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.file.read(n + 2)[:-2]
        if kind == b"*":
            return [self.read() for _ in range(int(rest))]
        raise RuntimeError(f"unexpected reply {line!r}")


def msgpack(numbers):
    # Unsigned integers below 2^53, as src/store/redis/msgpack.rs writes them.
    n = len(numbers)
    out = bytes([0x90 | n]) if n < 16 else b"\xdc" + struct.pack(">H", n)
    for v in numbers:
        if v < 0x80:
            out += bytes([v])
        elif v < 1 << 32:
            out += b"\xce" + struct.pack(">I", v)
        else:
            out += b"\xcf" + struct.pack(">Q", v)
    return out


def main():
    port = int(sys.argv[1])
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 5000
    redis = Redis(port)
    sha = redis.call("SCRIPT", "LOAD", script()).decode()
    now = int(time.time() * 1e6)
    window = now // 60_000_000
    for requests, distinct in ((1, False), (25, False), (25, True)):
        # Distinct keys: one pass over the 100,000 keys first, so that the
        # calls measured find their keys written (as in a window's steady
        # state), then the measured calls go on through the same keys.
        warm = 100_000 // requests if distinct else 0
        for i in range(warm + calls):
            if i == warm:
                redis.call("CONFIG", "RESETSTAT")
            keys, numbers = [], [requests]
            for r in range(requests):
                tag = f"k{(i * requests + r) % 100_000}" if distinct else "hot"
                current = f"bench:{{{tag}}}:sw:minute:{window}"
                if current not in keys:
                    keys += [current, f"bench:{{{tag}}}:sw:minute:{window - 1}"]
                k = keys.index(current) + 1
                # One sliding-window check: requests' layout in batch.lua.
                numbers += [1, now, ord("s"), k, k + 1, 4_000_000_000,
                            window * 60_000_000, (window + 1) * 60_000_000, 1, 1, ord("1")]
            redis.call("EVALSHA", sha, len(keys), *keys, msgpack(numbers))
        stats = next(l for l in redis.call("INFO", "commandstats").decode().splitlines()
                     if l.startswith("cmdstat_evalsha:"))
        per_call = float(stats.split("usec_per_call=")[1].split(",")[0])
        what = "distinct keys" if distinct else "one hot key"
        print(f"{requests:3} request(s) per call, {what:13}: {per_call:7.1f} us per call, "
              f"{per_call / requests:5.1f} us per request")


if __name__ == "__main__":
    main()
