"""A plain TCP throughput test, run inside the emulated namespaces by ``EmulatedCluster.check``.

``python netcheck.py recv PORT SECONDS WARMUP`` listens on ``PORT``, prints ``ready`` once it
listens, accepts one connection and counts the bytes that arrive after ``WARMUP`` seconds from
the first byte (so that TCP slow start and the token bucket's initial burst are left out). It
prints one JSON line ``{"bytes": B, "seconds": S}`` and exits.

``python netcheck.py send HOST PORT SECONDS`` connects and writes as fast as the socket accepts
for ``SECONDS`` seconds.

This file is run by path (it imports nothing from the package), so it works in a namespace
whatever the install looks like.
"""
from __future__ import annotations

import json
import socket
import sys
import time

_BUF = 1 << 18


def receive(port: int, seconds: float, warmup: float) -> dict:
    """Accept one sender on ``port`` and measure its rate over ``seconds`` after ``warmup``."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(1)
    # A sender that never comes must not hang the check.
    srv.settimeout(20.0)
    print("ready", flush=True)
    conn, _ = srv.accept()
    conn.settimeout(10.0)
    buf = bytearray(_BUF)
    view = memoryview(buf)
    got = conn.recv_into(view)
    if got == 0:
        raise SystemExit("netcheck: sender closed before sending anything")
    start = time.perf_counter() + warmup
    stop = start + seconds
    counted = 0
    while True:
        n = conn.recv_into(view)
        if n == 0:
            break
        now = time.perf_counter()
        if now >= stop:
            break
        if now >= start:
            counted += n
    elapsed = min(time.perf_counter(), stop) - start
    conn.close()
    srv.close()
    if elapsed <= 0:
        raise SystemExit("netcheck: the sender stopped during the warm-up")
    return {"bytes": counted, "seconds": elapsed}


def send(host: str, port: int, seconds: float) -> None:
    """Write to ``host:port`` as fast as the socket accepts for ``seconds`` seconds."""
    conn = socket.create_connection((host, port), timeout=10.0)
    payload = b"\0" * _BUF
    stop = time.perf_counter() + seconds
    try:
        while time.perf_counter() < stop:
            conn.sendall(payload)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the receiver stops reading once it has its window
    finally:
        conn.close()


def main(argv: list) -> int:
    if len(argv) == 4 and argv[0] == "recv":
        print(json.dumps(receive(int(argv[1]), float(argv[2]), float(argv[3]))), flush=True)
        return 0
    if len(argv) == 4 and argv[0] == "send":
        send(argv[1], int(argv[2]), float(argv[3]))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
