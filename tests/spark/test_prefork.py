"""The prefork server: forks a warm Python per request, as ``python -m`` would run, else declines."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from latticed.spark import prefork, prefork_client
from latticed.spark import python_workers as wp

CLIENT = prefork_client.__file__

TOY_MODULE = """\
import os, sys, time
if __name__ == "__main__":
    if sys.argv[1:2] == ["wait"]:
        with open(sys.argv[2], "w") as out:
            out.write(str(os.getpid()))
    threads = len(os.listdir("/proc/self/task"))
    print(os.getppid(), threads, os.getcwd(), os.environ.get("TOY"), *sys.argv[1:], flush=True)
    if sys.argv[1:2] == ["wait"]:
        time.sleep(60)
    sys.exit(int(sys.argv[1]) if sys.argv[1:2] and sys.argv[1].isdigit() else 0)
"""


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "toymod.py").write_text(TOY_MODULE)
    (mods / "othermod.py").write_text(TOY_MODULE)
    return mods


def base_env(mods: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return {**env, "PYTHONPATH": str(mods), "PYTHONHASHSEED": "0"}


@pytest.fixture
def server(tmp_path: Path, toy: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    path = str(tmp_path / "prefork.sock")
    proc = subprocess.Popen(
        [sys.executable, "-u", "-m", "latticed.spark.prefork", path, "--serve", "toymod", "--warm", "json"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=base_env(toy),
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    try:
        yield proc, path
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)
        assert not Path(path).exists()  # it removes its socket as it goes


def run_client(
    path: str, args: list[str], env: dict[str, str], cwd: Path, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", "-S", CLIENT, path, sys.executable, *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        **kwargs,  # type: ignore[arg-type]
    )


def test_a_served_module_runs_in_a_fork_with_the_clients_world(
    server: tuple[subprocess.Popen[bytes], str], toy: Path, tmp_path: Path
) -> None:
    proc, path = server
    out = run_client(path, ["-m", "toymod", "7", "a b"], {**base_env(toy), "TOY": "yes"}, tmp_path)
    ppid, threads, cwd, toy_env, *argv = out.stdout.split()
    assert int(ppid) == proc.pid  # forked by the server, not exec'd
    assert threads == "1"
    assert cwd == str(tmp_path)
    assert toy_env == "yes"
    assert argv == ["7", "a", "b"]
    assert out.returncode == 7


def test_concurrent_starts_each_get_their_own_child(
    server: tuple[subprocess.Popen[bytes], str], toy: Path, tmp_path: Path
) -> None:
    proc, path = server
    clients = [
        subprocess.Popen(
            [sys.executable, "-I", "-S", CLIENT, path, sys.executable, "-m", "toymod", str(code)],
            env=base_env(toy),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            text=True,
        )
        for code in range(8)
    ]
    outputs = [client.communicate(timeout=60)[0] for client in clients]
    assert [client.returncode for client in clients] == list(range(8))
    assert all(int(out.split()[0]) == proc.pid for out in outputs)


def test_declined_requests_start_cold_as_the_same_command(
    server: tuple[subprocess.Popen[bytes], str], toy: Path, tmp_path: Path
) -> None:
    proc, path = server
    cases = [
        (["-m", "othermod", "3"], base_env(toy)),  # not served
        (["-m", "toymod", "3"], {**base_env(toy), "PYTHONHASHSEED": "1"}),  # another hash seed
        (["-m", "toymod", "3"], {**base_env(toy), "PYTHONPATH": f"{toy}:{tmp_path}"}),  # a path it lacks
    ]
    for args, env in cases:
        out = run_client(path, args, env, tmp_path)
        assert int(out.stdout.split()[0]) == os.getpid(), args  # exec'd in place: our child
        assert out.returncode == 3
    out = run_client(path, ["-c", "print('plain')"], base_env(toy), tmp_path)
    assert out.stdout == "plain\n"
    proc.stdin.close()  # type: ignore[union-attr]
    proc.wait(timeout=30)
    stderr = proc.stderr.read().decode()  # type: ignore[union-attr]
    assert "PYTHONHASHSEED differs" in stderr
    assert f"{tmp_path!s}' is not on the server's path" in stderr
    assert "othermod" not in stderr  # an unserved module is routine, not worth a line


def test_a_server_that_is_gone_means_a_cold_start(toy: Path, tmp_path: Path) -> None:
    out = run_client(str(tmp_path / "nobody.sock"), ["-m", "toymod", "5"], base_env(toy), tmp_path)
    assert int(out.stdout.split()[0]) == os.getpid()
    assert out.returncode == 5


def test_signals_reach_the_child_and_a_vanished_client_takes_it_along(
    server: tuple[subprocess.Popen[bytes], str], toy: Path, tmp_path: Path
) -> None:
    _, path = server
    for signum, expected in ((signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGKILL, None)):
        pid_file = tmp_path / f"pid-{signum}"
        client = subprocess.Popen(
            [sys.executable, "-I", "-S", CLIENT, path, sys.executable, "-m", "toymod", "wait", str(pid_file)],
            env=base_env(toy),
            stdout=subprocess.PIPE,
        )
        assert client.stdout is not None
        client.stdout.readline()  # the child is running (and wrote its pid first)
        child = os.pidfd_open(int(pid_file.read_text()))
        try:
            client.send_signal(signum)
            code = client.wait(timeout=30)
            if expected is not None:
                assert code == expected  # the client exits as the child did
            # The child goes too: its pidfd turns readable when it exits.
            assert select.select([child], [], [], 30)[0] == [child]
        finally:
            os.close(child)


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as listing:
        return [int(child) for child in listing.read().split()]


def test_a_client_gone_before_it_hears_the_pid_takes_its_child_along(
    server: tuple[subprocess.Popen[bytes], str], toy: Path, tmp_path: Path
) -> None:
    """The child may run before the server has answered with its pid, and the client may be killed right
    then: the answer then fails, and the child must not outlive its client."""
    proc, path = server
    argv = ["-m", "toymod", "wait", str(tmp_path / "pid")]
    env = {key.encode(): value.encode() for key, value in base_env(toy).items()}
    body = prefork_client.encode_request(argv, env, b"/")
    null = [os.open(os.devnull, os.O_RDWR) for _ in range(3)]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        socket.send_fds(sock, [prefork_client.HEADER.pack(len(body))], null)
        sock.sendall(body)
    finally:
        sock.close()  # gone before the server's answer
        for fd in null:
            os.close(fd)
    # The server takes requests one at a time: once a later one is answered, ours has been handled.
    assert run_client(path, ["-m", "toymod", "0"], base_env(toy), tmp_path).returncode == 0
    deadline = time.monotonic() + 30
    while _children(proc.pid):  # our child sleeps 60 s unless the server ends it with its client
        assert time.monotonic() < deadline, "a child outlived its client"
        time.sleep(0.05)


def test_a_signal_sent_before_the_child_pid_is_known_still_reaches_the_child(tmp_path: Path) -> None:
    """The server's child may run before its pid reaches the stand-in, and Spark may stop the query right
    then: the stand-in must hold the signal and pass it on, not die of it and leave the child behind."""
    path = str(tmp_path / "fake.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    client = subprocess.Popen([sys.executable, "-I", "-S", CLIENT, path, sys.executable, "-m", "toymod"])
    child: subprocess.Popen[bytes] | None = None
    try:
        conn, _ = listener.accept()
        header, fds, _, _ = socket.recv_fds(conn, prefork_client.HEADER.size, 3)
        for fd in fds:
            os.close(fd)
        (size,) = prefork_client.HEADER.unpack(header)
        assert len(prefork_client.receive_exactly(conn, size)) == size
        client.send_signal(signal.SIGTERM)  # the stand-in is waiting for the pid
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        conn.sendall(prefork_client.STATUS.pack(child.pid))
        assert child.wait(timeout=30) == -signal.SIGTERM  # passed on once the pid was known
        conn.sendall(prefork_client.STATUS.pack(child.returncode))
        assert client.wait(timeout=30) == 128 + signal.SIGTERM  # and it exits as the child did
    finally:
        for proc in (client, child):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        listener.close()


def test_the_wrapper_hands_module_starts_to_the_server(
    server: tuple[subprocess.Popen[bytes], str], toy: Path, tmp_path: Path
) -> None:
    proc, path = server
    script = tmp_path / "python"
    script.write_text(wp.wrapper_text(sys.executable, tmp_path / "lib"))
    script.chmod(0o755)
    env = {**base_env(toy), wp.PREFORK_ENV: path, "PYTHONPATH": f"{tmp_path}/lib/pyspark.zip:{toy}"}
    out = subprocess.run(
        [str(script), "-m", "toymod", "x"], env=env, capture_output=True, text=True, check=True
    )
    assert int(out.stdout.split()[0]) == proc.pid
    out = subprocess.run([str(script), "-c", "print(1)"], env=env, capture_output=True, text=True, check=True)
    assert out.stdout == "1\n"  # anything but -m runs as before


def test_the_socket_is_private_and_bad_requests_are_hung_up_on(
    server: tuple[subprocess.Popen[bytes], str], toy: Path, tmp_path: Path
) -> None:
    proc, path = server
    assert Path(path).stat().st_mode & 0o777 == 0o600
    for garbage in (
        b"",
        b"\x00\x00",
        prefork_client.HEADER.pack(1 << 30),
        prefork_client.HEADER.pack(4) + b"x",
    ):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(path)
            sock.sendall(garbage)
            sock.shutdown(socket.SHUT_WR)
            try:
                answer = sock.recv(16)
            except ConnectionResetError:  # closed with our bytes unread
                answer = b""
            assert answer == b""  # hung up on, nothing started
    out = run_client(path, ["-m", "toymod", "0"], base_env(toy), tmp_path)
    assert int(out.stdout.split()[0]) == proc.pid  # and it still serves


@given(
    argv=st.lists(st.text(st.characters(exclude_characters="\0", exclude_categories=("Cs",)))),
    env=st.dictionaries(
        st.binary(min_size=1).filter(lambda k: b"\0" not in k and b"=" not in k),
        st.binary().filter(lambda v: b"\0" not in v),
    ),
    cwd=st.binary(min_size=1).filter(lambda c: b"\0" not in c),
)
def test_requests_round_trip(argv: list[str], env: dict[bytes, bytes], cwd: bytes) -> None:
    request = prefork.decode_request(prefork_client.encode_request(argv, env, cwd))
    assert (request.argv, request.env, request.cwd) == (argv, env, cwd)


def test_policy(tmp_path: Path) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    read_end, write_end = os.pipe()
    try:
        server = prefork.Server(listener, read_end, ["m"], environ={b"PYTHONHASHSEED": b"0"})
        server.single_threaded = True
        on_path = next(p for p in sys.path if p and os.path.isdir(p))

        def request(argv: list[str], **env: str) -> prefork.Request:
            return prefork.Request(argv, {k.encode(): v.encode() for k, v in env.items()}, b"/")

        assert server.decline_reason(request(["-m", "m"], PYTHONHASHSEED="0")) is None
        jar = f"{on_path}:/opt/spark/jars/spark-core.jar"
        assert server.decline_reason(request(["-m", "m", "x"], PYTHONHASHSEED="0", PYTHONPATH=jar)) is None
        assert "not a served module" in str(server.decline_reason(request(["-m", "n"], PYTHONHASHSEED="0")))
        assert "not a served module" in str(server.decline_reason(request(["-c", "m"], PYTHONHASHSEED="0")))
        assert "PYTHONHASHSEED" in str(server.decline_reason(request(["-m", "m"])))
        assert "PYTHONOPTIMIZE" in str(
            server.decline_reason(request(["-m", "m"], PYTHONHASHSEED="0", PYTHONOPTIMIZE="2"))
        )
        assert "/elsewhere" in str(
            server.decline_reason(request(["-m", "m"], PYTHONHASHSEED="0", PYTHONPATH="/elsewhere"))
        )
        server.single_threaded = False
        assert server.decline_reason(request(["-m", "m"], PYTHONHASHSEED="0")) == "the server has threads"
    finally:
        listener.close()
        for fd in (read_end, write_end):
            os.close(fd)
