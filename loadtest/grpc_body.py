#!/usr/bin/env python3
"""Writes a gRPC-framed envoy.service.ratelimit.v3.RateLimitRequest for h2load -d.

usage: grpc_body.py OUT DOMAIN KEY=VALUE[,KEY=VALUE...] [KEY=VALUE...]
Each argument after DOMAIN is one descriptor; commas separate its entries.
"""
import struct
import sys


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(number, payload):
    # wire type 2: length-delimited
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    out, domain, descriptors = sys.argv[1], sys.argv[2], sys.argv[3:]
    msg = field(1, domain.encode())
    for d in descriptors:
        entries = b""
        for pair in d.split(","):
            key, _, value = pair.partition("=")
            entries += field(1, field(1, key.encode()) + field(2, value.encode()))
        msg += field(2, entries)
    with open(out, "wb") as f:
        f.write(struct.pack(">BI", 0, len(msg)) + msg)


if __name__ == "__main__":
    main()
