"""A warm Python that forks Spark's per-query planner processes, instead of Spark starting them cold.

Every streaming query runs its source in a fresh ``python -m pyspark.sql.streaming.
python_streaming_source_runner`` (and batch reads plan in fresh ``pyspark.sql.worker.*`` processes):
~0.4 s of imports (pyspark, pyarrow, numpy, latticed) before the query's first batch, each time. Spark's
own worker daemon avoids that for tasks by forking a warm process; it does not for these. This server
does: it imports what those modules need once, then forks a child per request that runs the module as
``python -m`` would, with the requester's descriptors, environment and working directory. The
``PYSPARK_PYTHON`` wrapper sends it the requests through ``prefork_client.py`` (see
``python_workers.py``).

Fork safety: the server starts no threads, and keeps numpy's OpenBLAS and Arrow's jemalloc from starting
theirs (one thread each otherwise); if any thread exists anyway, it declines every request and each
process starts cold as before. It also declines a module it does not serve, a ``PYTHONPATH`` entry it
did not start with (a different pyspark, say) and interpreter settings (``PYTHONHASHSEED``...) that
differ from its own. Only processes of its own user may connect. It exits when its parent (the driver)
closes its stdin; a child lives no longer than the client that asked for it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import runpy
import selectors
import signal
import socket
import struct
import sys
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from latticed.spark.prefork_client import HEADER, STATUS, receive_exactly

#: The modules Spark starts cold per query or per planning step; these are what the server forks.
SERVED: Final = (
    "pyspark.sql.streaming.python_streaming_source_runner",
    "pyspark.sql.worker.plan_data_source_read",
    "pyspark.sql.worker.create_data_source",
    "pyspark.sql.worker.lookup_data_sources",
    "pyspark.sql.worker.data_source_pushdown_filters",
)
#: Imported once up front besides the served modules: what their children would import anyway.
WARM: Final = ("pyarrow", "latticed.spark.source", "latticed.spark.partition_reader")
#: Read by the native libraries at load time: no helper threads in the server, so forking it is safe.
SINGLE_THREADED_ENV: Final = {
    "OPENBLAS_NUM_THREADS": "1",
    "JE_ARROW_MALLOC_CONF": "background_thread:false",
}
#: Settings fixed when an interpreter starts: a child shares the server's, so they must agree.
INTERPRETER_ENV: Final = (
    b"PYTHONHASHSEED",
    b"PYTHONOPTIMIZE",
    b"PYTHONIOENCODING",
    b"PYTHONUTF8",
    b"PYTHONWARNINGS",
    b"PYTHONDEVMODE",
    b"PYTHONHOME",
    b"PYTHONSAFEPATH",
    b"PYTHONNOUSERSITE",
)
MAX_REQUEST_BYTES: Final = 1 << 20
REQUEST_TIMEOUT_S: Final = 5.0


@dataclass(frozen=True, slots=True)
class Request:
    argv: list[str]
    env: dict[bytes, bytes]
    cwd: bytes

    @property
    def module(self) -> str | None:
        return self.argv[1] if len(self.argv) >= 2 and self.argv[0] == "-m" else None


def decode_request(body: bytes) -> Request:
    """Inverse of :func:`~latticed.spark.prefork_client.encode_request`; raises ValueError."""
    fields = body.split(b"\0")
    if len(fields) < 2:
        raise ValueError("short request")
    argc = int(fields[1])
    if argc < 0 or len(fields) < 2 + argc:
        raise ValueError("bad argument count")
    argv = [os.fsdecode(arg) for arg in fields[2 : 2 + argc]]
    env: dict[bytes, bytes] = {}
    for entry in fields[2 + argc :]:
        key, sep, value = entry.partition(b"=")
        if not sep or not key:
            raise ValueError("bad environment entry")
        env[key] = value
    return Request(argv, env, fields[0])


def thread_count() -> int:
    """Threads of this process, from /proc; 2 where that cannot be read, so that an unknown count never
    passes for safe to fork."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 2


class Server:
    """Accepts fork requests on ``listener`` until ``parent_fd`` reaches end of file."""

    def __init__(
        self,
        listener: socket.socket,
        parent_fd: int,
        served: Iterable[str] = SERVED,
        *,
        environ: dict[bytes, bytes] | None = None,
    ) -> None:
        self.listener = listener
        self.parent_fd = parent_fd
        self.served = frozenset(served)
        started_env = dict(os.environb if environ is None else environ)
        self.interpreter_env = {key: started_env.get(key) for key in INTERPRETER_ENV}
        self.paths = {os.path.realpath(p) for p in sys.path if p}
        self.single_threaded = thread_count() == 1
        self.children: dict[int, socket.socket] = {}
        #: Reasons already reported (once each: a declined module is asked for again every query).
        self.declined: set[str] = set()
        self.selector = selectors.DefaultSelector()
        self._wake_r = self._wake_w = -1

    # ------------------------------------------------------------------ policy
    def decline_reason(self, request: Request) -> str | None:
        """Why this request must start cold instead (None: fork it)."""
        if not self.single_threaded:
            return "the server has threads"
        if request.module not in self.served:
            return f"not a served module: {request.module!r}"
        for key, wanted in self.interpreter_env.items():
            if request.env.get(key) != wanted:
                return f"{key.decode()} differs from the server's"
        for entry in request.env.get(b"PYTHONPATH", b"").split(b":"):
            path = os.fsdecode(entry)
            # Spark also lists its core jar, which holds no Python: harmless to add in the child.
            if path and not path.endswith(".jar") and os.path.realpath(path) not in self.paths:
                return f"PYTHONPATH entry {path!r} is not on the server's path"
        return None

    # ------------------------------------------------------------------ loop
    def serve(self) -> None:
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        signal.set_wakeup_fd(self._wake_w)
        signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
        selector = self.selector
        selector.register(self.listener, selectors.EVENT_READ, "accept")
        selector.register(self.parent_fd, selectors.EVENT_READ, "parent")
        selector.register(self._wake_r, selectors.EVENT_READ, "signal")
        while True:
            for key, _ in selector.select():
                if key.data == "parent":
                    if not os.read(self.parent_fd, 4096):
                        self._shut_down()
                        return
                elif key.data == "signal":
                    os.read(self._wake_r, 4096)
                elif key.data == "accept":
                    self._accept()
                else:
                    self._client_readable(key.fileobj, key.data)  # type: ignore[arg-type]
            self._reap()

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        fds: list[int] = []
        try:
            conn.settimeout(REQUEST_TIMEOUT_S)
            _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            header, fds, _, _ = socket.recv_fds(conn, HEADER.size, 3)
            if uid != os.getuid() or len(header) != HEADER.size or len(fds) != 3:
                raise ValueError("not a request from this user")
            (size,) = HEADER.unpack(header)
            if size > MAX_REQUEST_BYTES:
                raise ValueError("request too large")
            body = receive_exactly(conn, size)
            if len(body) != size:
                raise ValueError("cut-off request")
            request = decode_request(body)
            reason = self.decline_reason(request)
            if reason is not None:
                conn.sendall(STATUS.pack(0))
                if reason not in self.declined and request.module in self.served:
                    self.declined.add(reason)
                    print(f"latticed prefork: starting cold ({reason})", file=sys.stderr, flush=True)
                raise ValueError(reason)
            pid = os.fork()
            if pid == 0:
                self._become(request, fds, conn)  # never returns
            self.children[pid] = conn
            try:
                conn.sendall(STATUS.pack(pid))
            except OSError:
                # The client went away between its request and our answer (the child may well have run
                # first): its child goes with it, and is reaped, and its connection closed, as any other.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
                return
            self.selector.register(conn, selectors.EVENT_READ, pid)
        except (OSError, ValueError):
            conn.close()
        finally:
            for fd in fds:
                os.close(fd)

    def _client_readable(self, conn: socket.socket, pid: int) -> None:
        """The client of ``pid`` closed its end (it sends nothing after the request): it is gone, so
        is the one Spark would stop through it."""
        try:
            data = conn.recv(1)
        except OSError:
            data = b""
        if not data:
            self.selector.unregister(conn)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(conn)
            with contextlib.suppress(OSError):
                conn.sendall(STATUS.pack(os.waitstatus_to_exitcode(status)))
            conn.close()

    def _shut_down(self) -> None:
        for pid, conn in self.children.items():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            conn.close()
        self.listener.close()

    # ------------------------------------------------------------------ the child
    def _become(self, request: Request, fds: Sequence[int], conn: socket.socket) -> None:
        """In the forked child: turn into ``python -m MODULE ARGS`` as the client would have run it."""
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
                signal.signal(signum, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            self.selector.close()
            self.listener.close()
            conn.close()
            for other in self.children.values():
                other.close()
            for fd in (self._wake_r, self._wake_w, self.parent_fd):
                os.close(fd)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            for fd in fds:
                if fd > 2:
                    os.close(fd)
            os.chdir(request.cwd)
            os.environb.clear()
            os.environb.update(request.env)
            module = request.module
            assert module is not None
            sys.argv = [module, *request.argv[2:]]
            pythonpath = [os.fsdecode(p) for p in request.env.get(b"PYTHONPATH", b"").split(b":") if p]
            sys.path[:0] = [p for p in pythonpath if p not in sys.path]  # where python -m puts them
            sys.modules.pop(module, None)  # runs afresh as __main__, like python -m
            code = _run_module(module)
        except BaseException:
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)


def _run_module(module: str) -> int:
    """Run ``module`` as ``__main__``; the exit status ``python -m`` would give."""
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def warm_up(modules: Iterable[str]) -> None:
    """Import what the children will need; a module that cannot be imported here is left to them."""
    for name in modules:
        with contextlib.suppress(Exception):
            __import__(name)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Fork warm Python processes for Spark (see module doc).")
    parser.add_argument("socket", help="Unix socket path to listen on (its directory should be private)")
    parser.add_argument("--serve", action="append", help="a module to serve (repeatable; default Spark's)")
    parser.add_argument("--warm", action="append", help="a module to import up front (repeatable)")
    args = parser.parse_args(argv)
    unset = {key: value for key, value in SINGLE_THREADED_ENV.items() if os.environ.get(key) != value}
    if unset:
        # Importing this package loaded pyarrow (and numpy) already, with their helper threads: start
        # over with the settings that keep them from starting any.
        command = [
            sys.executable,
            "-u",
            "-m",
            "latticed.spark.prefork",
            *(sys.argv[1:] if argv is None else argv),
        ]
        os.execve(sys.executable, command, {**os.environ, **unset})
    environ = dict(os.environb)
    served = args.serve or list(SERVED)
    warm_up([*served, *(args.warm if args.warm is not None else WARM)])
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(args.socket)
    os.chmod(args.socket, 0o600)
    listener.listen(64)
    server = Server(listener, sys.stdin.fileno(), served, environ=environ)
    print("ready" if server.single_threaded else "ready (declining: threads)", flush=True)
    try:
        server.serve()
    finally:
        with contextlib.suppress(OSError):
            os.unlink(args.socket)


if __name__ == "__main__":
    main()
