"""``latticectl doctor``: a checklist of what makes a daemon work as a service, each with how to fix it.

Two sources. With the daemon running, it checks itself (the ``doctor`` API op: its data directory and
keys, which the person running ``latticectl`` may not be allowed to read, its disk, listen address, mDNS
interfaces, every peer's state, clock skew and forks) through :func:`daemon_checks`. Without it,
:func:`offline_checks` checks what it can from the config (``--config`` as for ``latticed run``): the same
files, the disk, whether the listen port is free, mDNS interfaces, whether each configured, added or
remembered peer accepts TCP connections. The client adds the socket and whether the Spark extra imports.

A check is ``ok`` (✔), not (✘, with a one-line ``fix``), or None (-: not applicable, or optional).
Nothing here uses trio; it runs in the CLI or in a worker thread of the daemon.

Why one module: it is one checklist, a short function per check with its fix text, in the order ``latticectl
doctor`` prints them; the daemon-side and the offline checks share the row type and the address and key
helpers.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.metadata
import importlib.util
import ipaddress
import socket
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from latticed.errors import LatticedError, MalformedError, StorageError
from latticed.host.config import DaemonConfig
from latticed.host.core2_reach import FIX as CORE2_FIX
from latticed.host.core2_reach import core2_blind_peers
from latticed.host.diskspace import DiskUsage, disk_is_low, disk_usage
from latticed.host.netkey import DEFAULT_NETWORK_KEY, read_network_key
from latticed.host.paths import data_dir_network_key_path, identity_key_path
from latticed.protocol.addresses import HostPort
from latticed.protocol.peerbook import PeerBook
from latticed.protocol.peerstate import (
    OTHER_NETWORKS_FIX,
    SKEW_WARN_MS,
    PeerRules,
    format_host_port,
    other_networks_text,
)

__all__ = [
    "Check",
    "check_data_dir",
    "check_disk",
    "check_forks",
    "check_clock",
    "check_corrupt",
    "check_mdns",
    "check_other_networks",
    "check_network_key",
    "check_peer_rows",
    "check_sealer",
    "check_secret_file",
    "check_spark",
    "daemon_checks",
    "offline_checks",
    "repair_fix",
]

#: Seconds to wait for a peer's TCP port when the daemon is not running.
PEER_CONNECT_TIMEOUT_S: Final = 2.0
#: At most this many peers are probed without a daemon (the rest are counted).
MAX_PROBED_PEERS: Final = 16
_KEY_FIX = (
    'make a private key: `latticed network-key new {path}`, set network_key_file = "{path}" in the '
    "config, restart, and give it to your other daemons (`latticectl invite` / `join`); `latticed init` "
    "does this for a new install"
)


@dataclass(frozen=True, slots=True)
class Check:
    """One line of the checklist."""

    check: str
    ok: bool | None
    detail: str
    fix: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"check": self.check, "ok": self.ok, "detail": self.detail, "fix": self.fix}

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> Check:
        ok = raw.get("ok")
        fix = raw.get("fix")
        return cls(
            str(raw.get("check", "?")),
            ok if isinstance(ok, bool) else None,
            str(raw.get("detail", "")),
            str(fix) if fix is not None else None,
        )


def size_text(nbytes: float) -> str:
    size = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def _unreadable(check: str, path: Path, exc: OSError) -> Check:
    return Check(
        check,
        None,
        f"cannot inspect {path}: {exc.strerror or exc} (run doctor as the daemon's user, e.g. "
        "`sudo -u latticed latticectl doctor --config /etc/latticed/latticed.toml`, or start the daemon)",
    )


# --- files ----------------------------------------------------------------------------------------------


def check_data_dir(path: Path) -> Check:
    """Exists, is a directory, no group or world access (the identity key lives there)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return Check("data dir", None, f"{path} does not exist yet (the first start creates it, mode 0700)")
    except OSError as exc:
        return _unreadable("data dir", path, exc)
    if not stat.S_ISDIR(st.st_mode):
        return Check(
            "data dir", False, f"{path} is not a directory", "move it away or set data_dir elsewhere"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        return Check(
            "data dir",
            False,
            f"{path} has mode {mode:04o}: others may read the identity key in it",
            f"chmod 700 {path}",
        )
    return Check("data dir", True, f"{path} (mode {mode:04o})")


def check_secret_file(check: str, path: Path, *, required: bool) -> Check:
    """A key file: present (if ``required``), a regular file, readable by its owner only."""
    try:
        st = path.stat()
    except FileNotFoundError:
        if required:
            return Check(check, False, f"{path} not found", "create it, or fix the path in the config")
        return Check(check, None, f"{path} does not exist yet (the first start creates it)")
    except OSError as exc:
        return _unreadable(check, path, exc)
    if not stat.S_ISREG(st.st_mode):
        return Check(check, False, f"{path} is not a regular file", "replace it with the key file")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        return Check(
            check, False, f"{path} has mode {mode:04o}: others can read this secret", f"chmod 600 {path}"
        )
    return Check(check, True, f"{path} (mode {mode:04o})")


def check_network_key(path: Path | None, *, data_dir: Path, public: bool | None = None) -> list[Check]:
    """The key file's permissions, and that the key is not the documented public one (anyone could join).
    ``public``: what the running daemon uses (None: read the file to find out). With no key file
    configured, the key ``join`` kept in the data directory is the one the daemon uses, if there is one."""
    kept = data_dir_network_key_path(data_dir)
    if path is None and kept.exists():
        path = kept
    suggested = path if path is not None else kept
    fix = _KEY_FIX.format(path=suggested)
    if path is None:
        return [
            Check("network key", False, "no network_key_file: the public default key, anyone can join", fix)
        ]
    checks = [check_secret_file("network key file", path, required=True)]
    if checks[0].ok is False:
        return checks
    if public is None:
        try:
            public = read_network_key(path) == DEFAULT_NETWORK_KEY
        except StorageError as exc:  # not ours to read (a system daemon's key, from a user's shell)
            checks.append(Check("network key", None, f"{exc} (run doctor as the daemon's user to check it)"))
            return checks
        except LatticedError as exc:
            checks.append(Check("network key", False, str(exc), fix))
            return checks
    if public:
        checks.append(
            Check("network key", False, f"{path} holds the public default key: anyone can join", fix)
        )
    else:
        checks.append(Check("network key", True, "private (not the public default key)"))
    return checks


def check_disk(usage: DiskUsage | None, *, error: str | None = None) -> Check:
    if usage is None:
        return Check(
            "disk", None if error is None else False, f"free space unknown: {error or 'not measured'}"
        )
    percent = f"{100 * usage.free_fraction:.0f} %"
    detail = f"{size_text(usage.free)} free of {size_text(usage.total)} ({percent}) on {usage.path}"
    if disk_is_low(usage.free, usage.total):
        return Check(
            "disk",
            False,
            f"low: only {detail}",
            "free space on that file system, or keep fewer records (retention, `latticectl truncate`); "
            "writes fail with exit 7 once it is full",
        )
    return Check("disk", True, detail)


# --- network ----------------------------------------------------------------------------------------------


def check_mdns(enabled: bool, *, listening: bool, interfaces: Sequence[str]) -> Check:
    """Whether mDNS runs, and on which interfaces."""
    if not enabled:
        return Check("mdns", None, "off: peers come from the config, invites and `latticectl peers add`")
    if not listening:
        return Check(
            "mdns",
            False,
            "on, but the daemon does not listen, so it announces nothing and finds nobody",
            'set listen = "0.0.0.0:7464" in the config (or mdns = false)',
        )
    try:
        from latticed.host.mdns_interfaces import mdns_interfaces  # noqa: PLC0415 - ifaddr only for this check

        found = mdns_interfaces(interfaces)
    except MalformedError as exc:
        return Check("mdns", False, str(exc), "fix mdns_interfaces in the config (`ip -br addr` lists them)")
    shown = ", ".join(f"{address} ({name})" for address, name in found)
    if all(ipaddress.ip_address(address).is_loopback for address, _ in found):
        return Check(
            "mdns", True, f"on {shown} only: no other IPv4 address, so only daemons on this host find it"
        )
    return Check("mdns", True, f"on {shown}")


def check_listen_running(listen: str | None, advertised: Iterable[str]) -> Check:
    if listen is None:
        return Check(
            "listen",
            False,
            "not listening: other daemons cannot dial this one (it can still dial them)",
            'set listen = "0.0.0.0:7464" in the config (`latticed init` writes it) and restart',
        )
    reach = ", ".join(advertised)
    return Check("listen", True, f"listening on {listen}" + (f" (reachable at {reach})" if reach else ""))


def check_listen_config(listen: HostPort | None) -> Check:
    """Without a daemon: is the configured port free to bind?"""
    if listen is None:
        return check_listen_running(None, ())
    host, port = listen
    shown = format_host_port(listen)
    if port == 0:
        return Check("listen", True, f"{shown}: the daemon will pick a free port")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return Check(
                "listen",
                False,
                f"{shown} is in use by another program",
                "stop it, or set another listen port in the config",
            )
        return Check(
            "listen", False, f"cannot bind {shown}: {exc.strerror or exc}", "fix listen in the config"
        )
    return Check("listen", True, f"{shown} is free for the daemon")


_PEER_FIX: Final = {
    "unreachable": "check that the peer's daemon runs and that {address} is reachable from here (firewall, "
    "address)",
    "no_answer": "give both daemons the same network key (`latticectl invite` on one, `latticectl join` on "
    "the other) and keep their clocks in sync (NTP)",
    "refused_us": "on that peer, add this daemon's identity (`latticectl id`) to allowed_peers, or "
    "`latticectl peers unblock` it there",
    "not_allowed": "add its identity to allowed_peers in the config if you trust it, or `latticectl peers "
    "remove` it",
    "handshake": "check both daemons run the same latticed version and network key",
    "incompatible": "upgrade the daemon the reason says is too old (both sides' versions are in it; "
    "docs/operations.md, Upgrades says which releases sync with which)",
    "incoming": "that host has another network key or is not allowed: `latticectl invite` here and "
    "`latticectl join` there if it is yours; otherwise ignore it or firewall it",
}


def check_peer_rows(rows: Sequence[Mapping[str, Any]]) -> list[Check]:
    """One line per peer from the ``peers`` rows: connected ✔, blocked -, anything else ✘ with its fix."""
    checks = []
    for row in rows:
        status = row.get("status")
        key = row.get("public_key")
        address = row.get("address") or "-"
        who = f"{key[:16]} at {address}" if isinstance(key, str) else str(address)
        reason = row.get("reason")
        if status == "self":
            continue
        if status == "connected":
            checks.append(Check("peer", True, f"{who}: connected"))
        elif status == "blocked":
            checks.append(Check("peer", None, f"{who}: blocked by you"))
        else:
            kind = row.get("failure")
            fix = _PEER_FIX.get(kind if isinstance(kind, str) else "unreachable", _PEER_FIX["unreachable"])
            detail = f"{who}: {status}" + (f" ({reason})" if reason else "")
            checks.append(Check("peer", False, detail, fix.format(address=address)))
    if not checks:
        checks.append(
            Check(
                "peer",
                False,
                "no peers: this daemon replicates with nobody",
                "`latticectl peers add HOST:PORT`, `latticectl join TOKEN`, or run it on a LAN with mDNS on",
            )
        )
    return checks


def check_other_networks(count: int | None, *, connected: bool) -> Check | None:
    """Daemons mDNS hears under another key (None: mDNS is off): the likely reason a fresh install sees
    no peers, so ✘ when none is connected, else only shown."""
    if count is None:
        return None
    if count == 0:
        return Check("lan", True, "mDNS hears no daemon of another network on this LAN")
    text = other_networks_text(count)
    if connected:
        return Check("lan", None, f"{text} (not of this one: ignored)")
    return Check("lan", False, f"{text}, and none of this network connected", OTHER_NETWORKS_FIX)


def check_peer_tcp(address: HostPort) -> Check:
    shown = format_host_port(address)
    try:
        with socket.create_connection(address, timeout=PEER_CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        return Check(
            "peer",
            False,
            f"{shown}: cannot connect: {exc.strerror or exc}",
            _PEER_FIX["unreachable"].format(address=shown),
        )
    return Check("peer", True, f"{shown} accepts connections (the handshake is checked once the daemon runs)")


def check_clock(skew: Sequence[Mapping[str, Any]]) -> list[Check]:
    if not skew:
        limit = SKEW_WARN_MS // 1000
        return [Check("clock", True, f"no peer clock is over {limit} s off ours (measured as peers connect)")]
    out = []
    for reading in skew:
        offset = int(reading.get("offset_ms", 0))
        who = reading.get("peer") or reading.get("address")
        way = "ahead of" if offset > 0 else "behind"
        out.append(
            Check(
                "clock",
                False,
                f"{str(who)[:16]}'s clock is {abs(offset) / 1000:.1f} s {way} ours",
                "run NTP on both hosts (`timedatectl set-ntp true`); beyond 2 minutes they cannot connect",
            )
        )
    return out


def check_forks(forks: Sequence[Mapping[str, Any]]) -> list[Check]:
    if not forks:
        return [Check("forks", True, "no forked queue")]
    return [_fork_check(fork) for fork in forks]


def _fork_check(fork: Mapping[str, Any]) -> Check:
    if fork.get("core") == 2:  # frozen at its fork point until its owner recovers it
        name = str(fork.get("queue", "?")).rpartition("/")[2]
        return Check(
            "forks",
            False,
            f"{fork.get('queue')} is forked at offset {fork.get('fork_point')}: frozen",
            f"on its owner's daemon, `latticectl queue recover {name}` (see `queue fork show {name}` first)"
            if fork.get("owned")
            else "its owner recovers it (`latticectl queue recover` there); it goes on here then",
        )
    return Check(
        "forks",
        False,
        f"{fork.get('queue')} is forked (proof {str(fork.get('proof') or '?')[:16]})",
        "its owner signed two histories (a restored or copied data directory?); it cannot be undone: see "
        "docs/operations.md; write new data to a new queue",
    )


_IDENTITY_FIX: Final = (
    "stop one of the two daemons (a copied data directory or cloned VM runs the same identity), or "
    '`latticectl identity claim` on the one to keep (docs/operations.md, "Two daemons, one identity")'
)


def check_identity(facts: Mapping[str, Any] | None) -> list[Check]:
    """Whether another daemon runs this identity (a peer told us, or a head of ours came back signed by
    another run), identities this daemon sees running twice, and the catch-up after the start."""
    if not facts:
        return []
    out = []
    refusing = facts.get("refusing")
    others = [r for r in facts.get("other_runs") or [] if isinstance(r, Mapping)]
    if isinstance(refusing, str):
        out.append(Check("identity", False, f"writes refused: {refusing}", _IDENTITY_FIX))
    elif others:
        where = ", ".join(str(r.get("address")) for r in others)
        claimed = " (claimed for this one)" if facts.get("claimed_at") is not None else ""
        out.append(
            Check(
                "identity",
                False,
                f"another daemon runs this identity (at {where}); this one keeps writing{claimed}",
                _IDENTITY_FIX,
            )
        )
    for seen in facts.get("seen_twice") or []:
        if not isinstance(seen, Mapping):
            continue
        earlier, later = seen.get("earlier") or {}, seen.get("later") or {}
        out.append(
            Check(
                "duplicate identity",
                False,
                f"{str(seen.get('identity'))[:16]} runs on two daemons, at {earlier.get('address')} "
                f"(earlier) and {later.get('address')} (later, told to stop writing); both are served",
                "on its host: " + _IDENTITY_FIX,
            )
        )
    catching_up = facts.get("catching_up")
    if isinstance(catching_up, str):
        out.append(Check("identity", None, catching_up))
    if not out:
        out.append(Check("identity", True, "no other daemon runs this identity, as far as its peers tell"))
    return out


def check_spark() -> Check:
    """The Spark extra (optional): pyspark, pyarrow and pandas are installed. Found, not imported:
    importing them takes about half a second, more than every other check together."""
    missing = [name for name in ("pyspark", "pyarrow", "pandas") if importlib.util.find_spec(name) is None]
    if "pyspark" in missing:
        return Check(
            "spark", None, "the Spark extra is not installed (optional: pip install 'latticed[spark]')"
        )
    if missing:
        return Check(
            "spark",
            False,
            f"the Spark extra is installed in part: {', '.join(missing)} missing",
            "pip install 'latticed[spark]'",
        )
    try:
        version = importlib.metadata.version("pyspark")
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    return Check("spark", True, f"pyspark {version} installed")


def check_sealer(accelerated: bool) -> Check:
    """Whether the daemon seals and opens sealed queues' batches with the compiled sealer (optional: the
    pure-Python one writes the same bytes, only more slowly)."""
    if accelerated:
        return Check("sealer", True, "compiled batch sealer (sealed queues)")
    return Check(
        "sealer",
        None,
        "pure-Python sealer: sealed offers run slower (optional: reinstall latticed where a C compiler "
        "and the Python headers are, e.g. `apt install gcc python3-dev`, to build the compiled one)",
    )


# --- the two lists -------------------------------------------------------------------------------------


def repair_fix(entry: Mapping[str, Any]) -> str:
    """What to do about a queue found corrupt (``store.queue_corrupt``; ``entry``: ``queue``, ``owned``):
    the ``queue repair`` command for it, by name."""
    address = str(entry.get("queue"))
    owned = entry.get("owned")
    kept = "latticed neither serves nor merges into it and keeps its data as it is until then"
    if owned is True:
        return (
            f"`latticectl queue repair {address.rpartition('/')[2]} --drop`: it is your own queue, so that "
            "drops this copy and peers send back what they hold (records no peer holds are lost; a backup "
            f"of the data directory keeps them); {kept}"
        )
    either = "" if owned is False else " (add --drop if it is this daemon's own queue: see its refusal)"
    return (
        f"`latticectl queue repair {address}`{either}: drops this copy and peers send the queue again, "
        f"verified; {kept}"
    )


def check_corrupt(corrupt: Sequence[Mapping[str, Any]]) -> list[Check]:
    """A failing ``store`` check for each queue found not to be what its owner signed, with its repair."""
    return [Check("store", False, str(c.get("error")), repair_fix(c)) for c in corrupt]


def daemon_checks(
    config: DaemonConfig,
    *,
    public_key: bool,
    listen: str | None,
    advertised: Sequence[str],
    peers: Sequence[Mapping[str, Any]],
    forks: Sequence[Mapping[str, Any]],
    skew: Sequence[Mapping[str, Any]],
    disk: DiskUsage | None,
    disk_error: str | None = None,
    sealer_accelerated: bool | None = None,
    other_networks: int | None = None,
    identity: Mapping[str, Any] | None = None,
    core2_queues: int = 0,
    corrupt: Sequence[Mapping[str, Any]] = (),
) -> list[Check]:
    """What the running daemon checks of itself (from a worker thread: it stats files and interfaces);
    ``other_networks``: daemons of other networks mDNS hears (None: mDNS off); ``core2_queues``: how many
    core-2 queues it holds (a connected peer without ``heads-v2`` receives none of them); ``corrupt``:
    the queues found not to be what their owner signed when they loaded (``store.queue_corrupt``)."""
    checks = [
        check_data_dir(config.data_dir),
        check_secret_file("identity key", identity_key_path(config.data_dir), required=True),
        *check_network_key(config.network_key_file, data_dir=config.data_dir, public=public_key),
        check_disk(disk, error=disk_error),
        check_listen_running(listen, advertised),
        check_mdns(config.mdns, listening=listen is not None, interfaces=config.mdns_interfaces),
        *check_peer_rows(peers),
        *(Check("core 2", False, b["message"], CORE2_FIX) for b in core2_blind_peers(peers, core2_queues)),
    ]
    lan = check_other_networks(
        other_networks, connected=any(row.get("status") == "connected" for row in peers)
    )
    if lan is not None:
        checks.append(lan)
    checks += check_clock(skew)
    checks += check_forks(forks)
    checks += check_corrupt(corrupt)
    checks += check_identity(identity)
    if sealer_accelerated is not None:
        checks.append(check_sealer(sealer_accelerated))
    return checks


def _known_peers(config: DaemonConfig) -> tuple[list[HostPort], list[Check]]:
    """Static, added and remembered peer addresses (each once), and checks for files that do not read."""
    problems: list[Check] = []
    addresses: list[HostPort] = list(config.peers)
    rules_path = config.data_dir / "peer_rules.json"
    with contextlib.suppress(FileNotFoundError):
        try:
            addresses += PeerRules.from_json(rules_path.read_text(encoding="utf-8")).added
        except OSError as exc:
            problems.append(_unreadable("peer rules", rules_path, exc))
        except MalformedError as exc:
            problems.append(
                Check(
                    "peer rules",
                    False,
                    f"{rules_path}: {exc}",
                    "fix it or move it away: the daemon will not start",
                )
            )
    book_path = config.data_dir / "peers.json"
    with contextlib.suppress(FileNotFoundError):
        try:
            book = PeerBook.from_json(
                book_path.read_text(encoding="utf-8"), now=0.0, forget_after=float("inf")
            )
            addresses += [(s.host, s.port) for s in book.snapshot()]
        except OSError as exc:
            problems.append(_unreadable("peer book", book_path, exc))
        except MalformedError as exc:
            problems.append(
                Check("peer book", None, f"{book_path} does not read ({exc}); the daemon starts anew")
            )
    return list(dict.fromkeys(addresses)), problems


def offline_checks(config: DaemonConfig) -> list[Check]:
    """What can be checked from the config while the daemon is not running."""
    usage: DiskUsage | None = None
    error: str | None = None
    existing = config.data_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent  # a data dir not made yet: the file system it will be on
    try:
        usage = disk_usage(existing)
    except OSError as exc:
        error = exc.strerror or str(exc)
    checks = [
        check_data_dir(config.data_dir),
        check_secret_file("identity key", identity_key_path(config.data_dir), required=False),
        *check_network_key(config.network_key_file, data_dir=config.data_dir),
        check_disk(usage, error=error),
        check_listen_config(config.listen),
        check_mdns(config.mdns, listening=config.listen is not None, interfaces=config.mdns_interfaces),
    ]
    addresses, problems = _known_peers(config)
    checks += problems
    for address in addresses[:MAX_PROBED_PEERS]:
        checks.append(check_peer_tcp(address))
    if len(addresses) > MAX_PROBED_PEERS:
        checks.append(Check("peer", None, f"{len(addresses) - MAX_PROBED_PEERS} more peers not probed"))
    if not addresses:
        checks += check_peer_rows([])
    return checks
