"""Daemon configuration: defaults from the environment, then a TOML file, then CLI overrides.

Keys are **snake_case** everywhere: in the TOML file, in ``overrides`` and as :class:`DaemonConfig` field
names, so an error message names the key exactly as the user wrote it. The file is flat (no tables)::

    data_dir = "/var/lib/latticed"
    listen = "[::]:7000"
    peers = ["192.0.2.10:7000", "[2001:db8::1]:7000"]
    mdns = true
    allowed_peers = ["3b6a27bc..."]      # 64 hex digits each (32-byte public keys)
    replicate = ["3b6a27bc*/*", "*/shared-*"]   # OWNER/NAME globs; default: everything
    metrics_listen = "127.0.0.1:9464"    # Prometheus endpoint; a bare port means loopback; default: off
    replica_max_bytes = "20MB"           # keep at most this much of each replicated queue
    replica_queue_caps = ["*/logs-*=100MB", "3b6a27bc*/audit=none"]   # per queue; first match wins
    producer_expiry_s = 604800           # forget a producer's sequences after 7 days without a write
    log_format = "json"                  # or "text"
    default_queue_core = 2               # fork core of queues created without --core; 1 while 0.2.0 peers run

Relative paths in the file are taken relative to the file's directory, relative paths in overrides
relative to the current directory; ``~`` expands with ``HOME`` from ``env``. Everything takes ``env``
explicitly so tests never read or change the real environment.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

from latticed.errors import MalformedError
from latticed.host.paths import MAX_SOCKET_PATH_BYTES, data_dir_network_key_path, identity_key_path
from latticed.host.retention_policy import parse_queue_cap, parse_size
from latticed.host.socket_path import SOCKET_NAME, default_socket_path
from latticed.protocol.addresses import HostPort, parse_host_port

LogFormat = Literal["json", "text"]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS: tuple[LogFormat, ...] = ("json", "text")

#: Where the system unit (``RuntimeDirectory=latticed``) puts the socket; a client run outside the unit
#: does not see ``$RUNTIME_DIRECTORY`` and may try this after :func:`default_socket_path`.
SYSTEM_SOCKET_PATH = Path("/run/latticed/latticed.sock")

#: Where a metrics endpoint given as a bare port listens.
LOOPBACK = "127.0.0.1"

#: The fork cores a queue can be created on (``default_queue_core``).
QUEUE_CORES = (1, 2)

#: The longest ``producer_expiry_s`` (ten years).
MAX_PRODUCER_EXPIRY_S = 10 * 365 * 86_400

_PUBLIC_KEY_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True, kw_only=True)
class DaemonConfig:
    """Everything the daemon reads at start-up; immutable so every component sees the same values.

    Construct it with :func:`load_config`; direct construction (tests) still gets the range checks.
    """

    data_dir: Path
    socket_path: Path
    #: Address to accept peers on; None keeps the daemon local-only (no replication listener).
    listen: HostPort | None = None
    #: Peers dialled at start-up, in addition to those found by mDNS.
    peers: tuple[HostPort, ...] = ()
    mdns: bool = True
    #: Interface names mDNS runs on; empty means all.
    mdns_interfaces: tuple[str, ...] = ()
    #: Shared secret that keeps other latticed networks out of the handshake; None means none.
    network_key_file: Path | None = None
    #: Accept peers beyond loopback although there is no private network key (anyone may join).
    insecure_public_network_key: bool = False
    #: Lower-case hex public keys allowed to connect; empty means any peer holding the network key.
    allowed_peers: tuple[str, ...] = ()
    #: ``OWNER_HEX/NAME`` glob patterns of the queues to replicate; empty means everything we hear of.
    replicate: tuple[str, ...] = ()
    log_level: str = "INFO"
    log_format: LogFormat = "json"
    #: How long a write waits for others to share its fsync.
    group_commit_ms: float = 2.0
    #: Largest frame accepted from a peer or client; bigger ones are a protocol error.
    max_frame_bytes: int = 16 * 1024 * 1024
    #: Where to serve Prometheus/OpenMetrics metrics over HTTP (port 0: any); None (the default): off.
    metrics_listen: HostPort | None = None
    #: Bytes of each replicated queue kept here at most (its oldest records are dropped locally); None:
    #: as much as the owner keeps.
    replica_max_bytes: int | None = None
    #: Per replicated queue, ``(OWNER/NAME glob, cap or None for no cap)``; the first match wins over
    #: ``replica_max_bytes``.
    replica_queue_caps: tuple[tuple[str, int | None], ...] = ()
    #: How often retention checks ages (and purges expired KV keys); byte and record limits are also
    #: checked as commits cross them.
    retention_interval_s: float = 10.0
    #: Seconds a producer may write nothing into a queue of ours before the owner forgets its sequences
    #: (docs/producers.md: a retry after that is written again); checked with retention's timer.
    producer_expiry_s: float = 7 * 86_400.0
    #: The fork core of a queue created without one (docs/lattice.md): 2 freezes a forked queue until its
    #: owner recovers it; 1 keeps queues a 0.2.0 daemon can receive (it never gets a core-2 queue).
    default_queue_core: int = 2

    def __post_init__(self) -> None:
        if self.log_level not in LOG_LEVELS:
            raise MalformedError(f"config key 'log_level': {self.log_level!r} is not one of {LOG_LEVELS}")
        if self.log_format not in LOG_FORMATS:
            raise MalformedError(f"config key 'log_format': {self.log_format!r} is not one of {LOG_FORMATS}")
        if self.group_commit_ms < 0:
            raise MalformedError(f"config key 'group_commit_ms': must be >= 0, got {self.group_commit_ms}")
        if self.max_frame_bytes <= 0:
            raise MalformedError(f"config key 'max_frame_bytes': must be > 0, got {self.max_frame_bytes}")
        if self.replica_max_bytes is not None and self.replica_max_bytes <= 0:
            raise MalformedError(f"config key 'replica_max_bytes': must be > 0, got {self.replica_max_bytes}")
        if not 0.01 <= self.retention_interval_s <= 86_400:
            raise MalformedError(
                f"config key 'retention_interval_s': {self.retention_interval_s} not in 0.01..86400 s"
            )
        if self.default_queue_core not in QUEUE_CORES:
            raise MalformedError(
                f"config key 'default_queue_core': {self.default_queue_core!r} is not one of {QUEUE_CORES}"
            )
        if not 1 <= self.producer_expiry_s <= MAX_PRODUCER_EXPIRY_S:
            limit = MAX_PRODUCER_EXPIRY_S
            raise MalformedError(
                f"config key 'producer_expiry_s': {self.producer_expiry_s} not in 1..{limit} s"
            )

    @property
    def identity_key_path(self) -> Path:
        """The node's private key; lives with the data so a restore brings the identity along."""
        return identity_key_path(self.data_dir)

    @property
    def network_key_path(self) -> Path:
        """Where the network key is kept: ``network_key_file``, else ``network.key`` in the data directory
        (``join`` stores the key of a daemon started without a key file there; the next start reads it)."""
        return self.network_key_file or data_dir_network_key_path(self.data_dir)


KEYS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(DaemonConfig))


# --- defaults -------------------------------------------------------------------------------------


def _get(env: Mapping[str, str], name: str) -> str | None:
    """An environment variable, treating empty as unset (as systemd and XDG do)."""
    value = env.get(name)
    return value if value else None


def _home(env: Mapping[str, str]) -> Path:
    home = _get(env, "HOME")
    return Path(home) if home else Path.home()


def default_data_dir(env: Mapping[str, str] = os.environ) -> Path:
    """``$STATE_DIRECTORY`` (systemd; first of a colon-separated list), else XDG state home."""
    state = _get(env, "STATE_DIRECTORY")
    if state:
        return Path(state.split(":")[0])
    xdg = _get(env, "XDG_STATE_HOME")
    # The XDG spec says relative values are invalid and must be ignored.
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "latticed"
    return _home(env) / ".local" / "state" / "latticed"


# --- value parsing --------------------------------------------------------------------------------


def _type_error(key: str, expected: str, value: object) -> MalformedError:
    return MalformedError(f"config key {key!r}: expected {expected}, got {type(value).__name__} {value!r}")


def _as_str(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise _type_error(key, "a string", value)
    return value


def _as_str_list(key: str, value: object) -> list[str]:
    if not isinstance(value, list | tuple):
        raise _type_error(key, "a list of strings", value)
    return [_as_str(f"{key}[{i}]", item) for i, item in enumerate(value)]


def _host_port(key: str, value: object, *, allow_port_zero: bool) -> HostPort:
    if isinstance(value, tuple) and len(value) == 2:
        host, port = value
        if not isinstance(host, str) or not isinstance(port, int) or isinstance(port, bool):
            raise _type_error(key, "'HOST:PORT' or (host, port)", value)
        value = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    text = _as_str(key, value)
    try:
        return parse_host_port(text, allow_port_zero=allow_port_zero)
    except MalformedError as exc:
        raise MalformedError(f"config key {key!r}: {exc}") from None


def _metrics_address(key: str, value: object) -> HostPort:
    """``HOST:PORT``, or a bare port (text or integer) meaning loopback: the endpoint is unauthenticated,
    so it is reachable from elsewhere only when an address says so."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = f"{LOOPBACK}:{value}"
    return _host_port(key, value, allow_port_zero=True)


def _path_parser(base: Path | None, env: Mapping[str, str]) -> Callable[[str, object], Path]:
    def parse(key: str, value: object) -> Path:
        if not isinstance(value, str | os.PathLike):
            raise _type_error(key, "a path string", value)
        text = os.fspath(value)
        if not isinstance(text, str) or not text:
            raise _type_error(key, "a non-empty path string", value)
        path = Path(text)
        if text == "~" or text.startswith("~/"):
            path = _home(env) / text[2:]
        if not path.is_absolute():
            path = (base / path) if base is not None else path.absolute()
        return path

    return parse


def _convert(key: str, value: object, parse_path: Callable[[str, object], Path]) -> object:
    """Turn one raw value (TOML or override) into the field's type, or raise naming the key."""
    if key in ("data_dir", "socket_path", "network_key_file"):
        return parse_path(key, value)
    if key == "listen":
        return _host_port(key, value, allow_port_zero=True)
    if key == "metrics_listen":
        return _metrics_address(key, value)
    if key == "peers":
        if not isinstance(value, list | tuple):
            raise _type_error(key, "a list of 'HOST:PORT' strings", value)
        return tuple(_host_port(f"{key}[{i}]", v, allow_port_zero=False) for i, v in enumerate(value))
    if key in ("mdns", "insecure_public_network_key"):
        if not isinstance(value, bool):
            raise _type_error(key, "true or false", value)
        return value
    if key in ("mdns_interfaces", "replicate"):
        return tuple(_as_str_list(key, value))
    if key == "allowed_peers":
        keys = []
        for i, item in enumerate(_as_str_list(key, value)):
            hexkey = item.strip().lower()
            if not _PUBLIC_KEY_HEX.fullmatch(hexkey):
                raise MalformedError(f"config key '{key}[{i}]': {item!r} is not 64 hex digits")
            keys.append(hexkey)
        return tuple(keys)
    if key == "log_level":
        level = _as_str(key, value).upper()
        if level not in LOG_LEVELS:
            raise MalformedError(f"config key {key!r}: {value!r} is not one of {', '.join(LOG_LEVELS)}")
        return level
    if key == "log_format":
        fmt = _as_str(key, value).lower()
        if fmt not in LOG_FORMATS:
            raise MalformedError(f"config key {key!r}: {value!r} is not one of {', '.join(LOG_FORMATS)}")
        return fmt
    if key == "group_commit_ms":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _type_error(key, "a number of milliseconds", value)
        if not 0 <= value <= 1000:
            raise MalformedError(f"config key {key!r}: {value} not in 0..1000 ms")
        return float(value)
    if key == "max_frame_bytes":
        if isinstance(value, bool) or not isinstance(value, int):
            raise _type_error(key, "an integer number of bytes", value)
        if not 1 <= value <= 2**31 - 1:
            raise MalformedError(f"config key {key!r}: {value} not in 1..{2**31 - 1}")
        return value
    if key == "replica_max_bytes":
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        try:
            return parse_size(_as_str(key, value), f"config key {key!r}")
        except MalformedError as exc:
            raise MalformedError(str(exc)) from None
    if key == "replica_queue_caps":
        if isinstance(value, tuple) and all(isinstance(v, tuple) for v in value):
            return value
        caps = []
        for i, item in enumerate(_as_str_list(key, value)):
            try:
                caps.append(parse_queue_cap(item))
            except MalformedError as exc:
                raise MalformedError(f"config key '{key}[{i}]': {exc}") from None
        return tuple(caps)
    if key == "default_queue_core":
        if isinstance(value, bool) or not isinstance(value, int) or value not in QUEUE_CORES:
            raise MalformedError(f"config key {key!r}: {value!r} is not one of {QUEUE_CORES}")
        return value
    if key in ("retention_interval_s", "producer_expiry_s"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _type_error(key, "a number of seconds", value)
        return float(value)
    raise _unknown_key(key)


def _unknown_key(key: str) -> MalformedError:
    hint = ""
    if key.replace("-", "_") in KEYS:
        hint = f" (keys are snake_case: did you mean {key.replace('-', '_')!r}?)"
    return MalformedError(f"unknown config key {key!r}{hint}")


# --- loading --------------------------------------------------------------------------------------


def read_config_file(path: Path) -> dict[str, object]:
    """Parse the TOML file; unreadable or invalid files are MalformedError naming the file."""
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise MalformedError(f"config file {path} not found (`latticed init` writes one)") from None
    except OSError as exc:
        raise MalformedError(f"config file {path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise MalformedError(f"config file {path}: {exc}") from exc


def load_config(
    path: Path | None,
    overrides: Mapping[str, object],
    env: Mapping[str, str] = os.environ,
) -> DaemonConfig:
    """Defaults from ``env``, then the TOML file at ``path`` (if any), then ``overrides``.

    An override whose value is None is ignored, so a CLI can pass every option it declares.
    Unknown keys and wrong types raise MalformedError naming the key (and the file).
    """
    values: dict[str, object] = {}
    if path is not None:
        parse_path = _path_parser(path.absolute().parent, env)
        for key, raw in read_config_file(path).items():
            try:
                values[key] = _convert(key, raw, parse_path)
            except MalformedError as exc:
                raise MalformedError(f"config file {path}: {exc}") from None
    parse_cwd = _path_parser(None, env)
    for key, raw in overrides.items():
        if key not in KEYS:
            raise _unknown_key(key)  # even when None: a misspelt CLI wiring should fail loudly
        if raw is not None:
            values[key] = _convert(key, raw, parse_cwd)

    values.setdefault("data_dir", default_data_dir(env))
    values.setdefault("socket_path", default_socket_path(env))
    socket_path = cast(Path, values["socket_path"])
    if len(os.fsencode(socket_path)) > MAX_SOCKET_PATH_BYTES:
        raise MalformedError(
            f"config key 'socket_path': {str(socket_path)!r} is longer than the "
            f"{MAX_SOCKET_PATH_BYTES} bytes a unix socket address can hold"
        )
    return DaemonConfig(**values)  # type: ignore[arg-type]


__all__ = [
    "KEYS",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "MAX_SOCKET_PATH_BYTES",
    "QUEUE_CORES",
    "SOCKET_NAME",
    "SYSTEM_SOCKET_PATH",
    "DaemonConfig",
    "HostPort",
    "LogFormat",
    "default_data_dir",
    "default_socket_path",
    "load_config",
    "parse_host_port",
    "read_config_file",
]
