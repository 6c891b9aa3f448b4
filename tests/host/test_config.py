"""Config loading (defaults, TOML, overrides) and the directory helpers in latticed.host.paths."""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from latticed.errors import MalformedError, StorageError
from latticed.host.config import (
    KEYS,
    SOCKET_NAME,
    DaemonConfig,
    default_data_dir,
    default_socket_path,
    load_config,
    parse_host_port,
)
from latticed.host.paths import ensure_data_dir, ensure_socket_dir, identity_key_path

HOME_ENV = {"HOME": "/home/alice"}
KEY_A = "ab" * 32


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "latticed.toml"
    path.write_text(text)
    return path


# --- defaults -------------------------------------------------------------------------------------


def test_data_dir_prefers_systemd_state_directory_first_entry() -> None:
    env = {"STATE_DIRECTORY": "/var/lib/latticed:/var/lib/other", "XDG_STATE_HOME": "/x", **HOME_ENV}
    assert default_data_dir(env) == Path("/var/lib/latticed")


def test_data_dir_falls_back_to_xdg_then_home() -> None:
    assert default_data_dir({"XDG_STATE_HOME": "/xdg/state", **HOME_ENV}) == Path("/xdg/state/latticed")
    assert default_data_dir(HOME_ENV) == Path("/home/alice/.local/state/latticed")
    # Empty and relative XDG values are invalid per the spec and ignored.
    assert default_data_dir({"STATE_DIRECTORY": "", "XDG_STATE_HOME": "rel", **HOME_ENV}) == Path(
        "/home/alice/.local/state/latticed"
    )


def test_socket_path_resolution_order() -> None:
    full = {
        "LATTICED_SOCKET": "/custom.sock",
        "RUNTIME_DIRECTORY": "/run/latticed",
        "XDG_RUNTIME_DIR": "/run/user/1000",
    }
    assert default_socket_path(full) == Path("/custom.sock")
    del full["LATTICED_SOCKET"]
    assert default_socket_path(full) == Path("/run/latticed") / SOCKET_NAME
    del full["RUNTIME_DIRECTORY"]
    assert default_socket_path(full) == Path("/run/user/1000/latticed") / SOCKET_NAME
    assert default_socket_path({}) == Path(f"/tmp/latticed-{os.getuid()}") / SOCKET_NAME


def test_defaults_without_file(tmp_path: Path) -> None:
    env = {"STATE_DIRECTORY": str(tmp_path / "state"), "RUNTIME_DIRECTORY": str(tmp_path / "run")}
    cfg = load_config(None, {}, env)
    assert cfg.data_dir == tmp_path / "state"
    assert cfg.socket_path == tmp_path / "run" / SOCKET_NAME
    assert cfg.listen is None
    assert cfg.peers == ()
    assert cfg.mdns is True
    assert cfg.group_commit_ms == 2.0
    assert cfg.max_frame_bytes == 16 * 1024 * 1024
    assert cfg.log_format == "json"
    assert cfg.metrics_listen is None  # the metrics endpoint is off unless asked for
    assert cfg.identity_key_path == tmp_path / "state" / "identity.key" == identity_key_path(cfg.data_dir)


def test_config_is_frozen(tmp_path: Path) -> None:
    cfg = load_config(None, {}, HOME_ENV)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.mdns = False  # type: ignore[misc]


# --- host:port ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:7000", ("127.0.0.1", 7000)),
        ("example.org:1", ("example.org", 1)),
        ("[::1]:7000", ("::1", 7000)),
        ("[::]:65535", ("::", 65535)),
        ("[fe80::1%eth0]:7000", ("fe80::1%eth0", 7000)),
    ],
)
def test_parse_host_port(text: str, expected: tuple[str, int]) -> None:
    assert parse_host_port(text) == expected


@pytest.mark.parametrize(
    "text",
    ["7000", ":7000", "host:", "host:x", "host:70000", "::1:7000", "[::1]7000", "[::1", "[host]:1", "h:0"],
)
def test_parse_host_port_rejects(text: str) -> None:
    with pytest.raises(MalformedError):
        parse_host_port(text)


def test_port_zero_only_for_listen() -> None:
    assert parse_host_port("127.0.0.1:0", allow_port_zero=True) == ("127.0.0.1", 0)
    assert load_config(None, {"listen": "127.0.0.1:0"}, HOME_ENV).listen == ("127.0.0.1", 0)
    with pytest.raises(MalformedError, match=r"peers\[0\]"):
        load_config(None, {"peers": ["127.0.0.1:0"]}, HOME_ENV)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('"127.0.0.1:9464"', ("127.0.0.1", 9464)),
        ('"9464"', ("127.0.0.1", 9464)),  # a bare port: loopback, never every interface
        ("9464", ("127.0.0.1", 9464)),
        ('"[::1]:0"', ("::1", 0)),
        ('"0.0.0.0:9464"', ("0.0.0.0", 9464)),  # explicitly everywhere
    ],
)
def test_metrics_listen_key(tmp_path: Path, raw: str, expected: tuple[str, int]) -> None:
    assert load_config(write(tmp_path, f"metrics_listen = {raw}\n"), {}, HOME_ENV).metrics_listen == expected


def test_metrics_listen_override_wins_and_bad_values_name_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, 'metrics_listen = "127.0.0.1:9464"\n')
    assert load_config(path, {"metrics_listen": "127.0.0.1:0"}, HOME_ENV).metrics_listen == ("127.0.0.1", 0)
    for bad in ('"host:"', '"70000"', "true", '""'):
        with pytest.raises(MalformedError, match="'metrics_listen'"):
            load_config(write(tmp_path, f"metrics_listen = {bad}\n"), {}, HOME_ENV)


# --- file + overrides -----------------------------------------------------------------------------


def test_full_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"""
        data_dir = "data"
        socket_path = "/run/x/latticed.sock"
        listen = "[::]:7000"
        peers = ["192.0.2.1:7000", "[2001:db8::1]:7001"]
        mdns = false
        mdns_interfaces = ["eth0", "wlan0"]
        network_key_file = "~/netkey"
        allowed_peers = ["{KEY_A.upper()}"]
        log_level = "debug"
        log_format = "text"
        group_commit_ms = 0
        max_frame_bytes = 1048576
        """,
    )
    cfg = load_config(path, {}, HOME_ENV)
    assert cfg == DaemonConfig(
        data_dir=tmp_path / "data",  # relative to the file's directory
        socket_path=Path("/run/x/latticed.sock"),
        listen=("::", 7000),
        peers=(("192.0.2.1", 7000), ("2001:db8::1", 7001)),
        mdns=False,
        mdns_interfaces=("eth0", "wlan0"),
        network_key_file=Path("/home/alice/netkey"),
        allowed_peers=(KEY_A,),
        log_level="DEBUG",
        log_format="text",
        group_commit_ms=0.0,
        max_frame_bytes=1048576,
    )
    assert isinstance(cfg.group_commit_ms, float)


def test_overrides_win_and_none_is_ignored(tmp_path: Path) -> None:
    path = write(tmp_path, 'listen = "127.0.0.1:7000"\nmdns = false\nlog_level = "warning"\n')
    cfg = load_config(
        path,
        {"listen": ("::1", 7001), "mdns": None, "data_dir": Path("/srv/l"), "peers": ("h:1",)},
        HOME_ENV,
    )
    assert cfg.listen == ("::1", 7001)
    assert cfg.mdns is False  # None override leaves the file's value
    assert cfg.log_level == "WARNING"
    assert cfg.data_dir == Path("/srv/l")
    assert cfg.peers == (("h", 1),)


def test_relative_override_path_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_config(None, {"data_dir": "d"}, HOME_ENV).data_dir == tmp_path / "d"


def test_unknown_key_names_key_and_file(tmp_path: Path) -> None:
    path = write(tmp_path, "colour = 1\n")
    with pytest.raises(MalformedError, match=r"latticed\.toml.*'colour'"):
        load_config(path, {}, HOME_ENV)
    with pytest.raises(MalformedError, match="'bogus'"):
        load_config(None, {"bogus": 1}, HOME_ENV)
    with pytest.raises(MalformedError, match="'bogus'"):
        load_config(None, {"bogus": None}, HOME_ENV)


def test_kebab_case_key_gets_a_hint(tmp_path: Path) -> None:
    with pytest.raises(MalformedError, match="did you mean 'data_dir'"):
        load_config(write(tmp_path, 'data-dir = "/x"\n'), {}, HOME_ENV)


def test_tables_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(MalformedError, match="'daemon'"):
        load_config(write(tmp_path, "[daemon]\nmdns = true\n"), {}, HOME_ENV)


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("mdns = 1", "mdns"),
        ('mdns = "yes"', "mdns"),
        ("listen = 7000", "listen"),
        ('listen = "7000"', "listen"),
        ('peers = "h:1"', "peers"),
        ("peers = [1]", r"peers\[0\]"),
        ('mdns_interfaces = "eth0"', "mdns_interfaces"),
        ('allowed_peers = ["abc"]', r"allowed_peers\[0\]"),
        ('log_level = "loud"', "log_level"),
        ('log_format = "xml"', "log_format"),
        ("group_commit_ms = -1", "group_commit_ms"),
        ("group_commit_ms = true", "group_commit_ms"),
        ("max_frame_bytes = 0", "max_frame_bytes"),
        ("max_frame_bytes = 1.5", "max_frame_bytes"),
        ("data_dir = 3", "data_dir"),
        ('data_dir = ""', "data_dir"),
        ("network_key_file = false", "network_key_file"),
    ],
)
def test_wrong_types_name_the_key(tmp_path: Path, line: str, key: str) -> None:
    with pytest.raises(MalformedError, match=f"'{key}'"):
        load_config(write(tmp_path, line + "\n"), {}, HOME_ENV)


def test_wrong_override_type_names_the_key() -> None:
    with pytest.raises(MalformedError, match="'max_frame_bytes'"):
        load_config(None, {"max_frame_bytes": "16M"}, HOME_ENV)


def test_bad_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(MalformedError, match=r"latticed\.toml"):
        load_config(write(tmp_path, "mdns = \n"), {}, HOME_ENV)
    with pytest.raises(MalformedError, match=r"nope\.toml"):
        load_config(tmp_path / "nope.toml", {}, HOME_ENV)


def test_socket_path_too_long() -> None:
    with pytest.raises(MalformedError, match="socket_path"):
        load_config(None, {"socket_path": "/" + "s" * 200}, HOME_ENV)


def test_every_field_is_a_key() -> None:
    assert set(KEYS) == {f.name for f in dataclasses.fields(DaemonConfig)}


def test_direct_construction_is_checked(tmp_path: Path) -> None:
    with pytest.raises(MalformedError, match="max_frame_bytes"):
        DaemonConfig(data_dir=tmp_path, socket_path=tmp_path / "s", max_frame_bytes=0)


# --- latticed.host.paths -------------------------------------------------------------------------------


def test_ensure_data_dir_creates_0700(tmp_path: Path) -> None:
    data = tmp_path / "a" / "b"
    old = os.umask(0o022)
    try:
        assert ensure_data_dir(data) == data
    finally:
        os.umask(old)
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert list(data.iterdir()) == []  # the write probe cleaned up after itself
    ensure_data_dir(data)  # idempotent


def test_ensure_data_dir_keeps_existing_mode_but_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "shared"
    data.mkdir()
    data.chmod(0o755)
    ensure_data_dir(data)
    assert stat.S_IMODE(data.stat().st_mode) == 0o755
    assert "0755" in caplog.text


def test_data_dir_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(StorageError, match="not a directory"):
        ensure_data_dir(tmp_path / "f")
    with pytest.raises(StorageError, match="not a directory"):
        ensure_data_dir(tmp_path / "f" / "sub")


@pytest.mark.parametrize(
    ("err", "message"), [(errno.EROFS, "read-only"), (errno.EACCES, "permission denied")]
)
def test_unwritable_data_dir_explains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int, message: str
) -> None:
    # Tests run as root here, where mode bits do not stop writes; inject the errno the kernel would give.
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr("latticed.host.paths.tempfile.mkstemp", refuse)
    with pytest.raises(StorageError, match=message):
        ensure_data_dir(tmp_path / "d")


NOBODY = 65534


def _refused_as(uid: int, data_dir: Path) -> str:
    """What ``ensure_data_dir`` says in a forked child that runs as ``uid`` (no exec: the child keeps the
    loaded interpreter, and giving up root drops every capability, so mode bits apply again)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            ensure_data_dir(data_dir)
            said = "created"
        except StorageError as e:
            said = str(e)
        except BaseException as e:  # anything else is a failure the parent reports
            said = f"unexpected {type(e).__name__}: {e}"
        os.write(write, said.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read().decode()
    os.waitpid(pid, 0)
    return said


def test_unwritable_data_dir_for_real(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(StorageError, match="permission denied"):
            ensure_data_dir(locked / "data")
        return
    # Root ignores mode bits: the same check from a child that gave up root. It must reach the locked
    # directory, so that lives in a directory of its own that others may enter (pytest's is 0700).
    base = Path(tempfile.mkdtemp(prefix="latticed-test-"))
    try:
        base.chmod(0o711)
        locked = base / "locked"
        locked.mkdir(mode=0o555)
        said = _refused_as(NOBODY, locked / "data")
        assert "permission denied" in said, said
        assert not (locked / "data").exists()
    finally:
        shutil.rmtree(base)


def test_ensure_socket_dir(tmp_path: Path) -> None:
    sock = tmp_path / "run" / "latticed.sock"
    assert ensure_socket_dir(sock) == tmp_path / "run"
    assert stat.S_IMODE((tmp_path / "run").stat().st_mode) == 0o700
    with pytest.raises(StorageError, match="bytes"):
        ensure_socket_dir(tmp_path / ("x" * 120) / "latticed.sock")
