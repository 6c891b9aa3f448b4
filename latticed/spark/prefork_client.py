"""Run ``python -m MODULE ...`` as a fork of the warm prefork server (see ``prefork.py``), else exec it.

Usage (from the ``PYSPARK_PYTHON`` wrapper): ``python -I -S prefork_client.py SOCKET PYTHON ARGS...``.
It runs with ``-I -S`` and imports only the standard library, so it starts in a few milliseconds.

The server's child runs with this process's stdin, stdout, stderr, environment and working directory;
this process stays as its stand-in for Spark: it forwards the signals Spark sends (``destroy()`` is a
SIGTERM) and exits with the child's status. If the server cannot be reached or declines (a module it
does not serve, a path it cannot honour), this process execs ``PYTHON ARGS...`` as if it never existed.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import sys

#: Header of a request: the length of the body that follows (the three descriptors ride with it).
HEADER = struct.Struct("!I")
#: A reply: the child's pid (0: declined), later its exit status (negative: killed by that signal).
STATUS = struct.Struct("!i")
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def encode_request(argv: list[str], env: dict[bytes, bytes], cwd: bytes) -> bytes:
    """NUL-separated: cwd, argument count, arguments, then ``KEY=VALUE`` entries."""
    fields = [cwd, str(len(argv)).encode(), *map(os.fsencode, argv)]
    fields += [key + b"=" + value for key, value in env.items()]
    return b"\0".join(fields)


def receive_exactly(sock: socket.socket, size: int) -> bytes:
    """``size`` bytes, or fewer if the other end closed first (the caller checks)."""
    chunks = []
    while size:
        chunk = sock.recv(min(size, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _start(path: str, argv: list[str]) -> tuple[socket.socket, int] | None:
    """Ask the server to fork ``argv``: (the connection, the child's pid), or None if it will not."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        body = encode_request(argv, dict(os.environb), os.getcwdb())
        socket.send_fds(sock, [HEADER.pack(len(body))], [0, 1, 2])
        sock.sendall(body)
        reply = receive_exactly(sock, STATUS.size)
    except OSError:
        sock.close()
        return None
    pid = STATUS.unpack(reply)[0] if len(reply) == STATUS.size else 0
    if pid <= 0:
        sock.close()
        return None
    return sock, pid


def main() -> None:
    path, python, *argv = sys.argv[1:]
    if argv[:1] != ["-m"]:
        os.execv(python, [python, *argv])
    # Handlers go in before the request: the child may be running before its pid reaches us, and a
    # signal Spark sends meanwhile must still reach it (held here until the pid is known).
    child = 0
    held: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if not child:
            held.append(signum)
            return
        try:  # noqa: SIM105 - no contextlib: this process imports as little as it can
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    started = _start(path, argv)
    if started is None:
        for signum in FORWARDED:
            signal.signal(signum, signal.SIG_DFL)
        for early in held:  # what the program would have met, had it been started right away
            os.kill(os.getpid(), early)
        os.execv(python, [python, *argv])
    sock, child = started
    for early in held:
        forward(early, None)
    try:
        reply = receive_exactly(sock, STATUS.size)  # a signal handled meanwhile does not interrupt it
    except OSError:
        reply = b""
    if len(reply) < STATUS.size:
        sys.exit(1)  # the server went away: the child was killed with it
    status = STATUS.unpack(reply)[0]
    sys.exit(128 - status if status < 0 else status)


if __name__ == "__main__":
    main()
