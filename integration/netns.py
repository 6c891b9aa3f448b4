"""Throwaway LANs in Linux network namespaces, for tests that need real hosts on a real (virtual) switch.

Layout of ``Lan(hosts=3)``, every name carrying a per-run prefix ``ldlan<pid>x<n>-``::

    namespace "<prefix>sw":  bridge br0, ports p1 p2 p3 (bridge-side veth ends), nft table "bridge ldlan"
    namespace "<prefix>h1":  lo, eth0 = 10.77.0.1/24  (veth peer of p1)
    namespace "<prefix>h2":  lo, eth0 = 10.77.0.2/24  ...

Every interface is created inside its own namespace (``ip -n SW link add pN type veth peer name eth0
netns HN``), so nothing ever appears in the caller's namespace and no traffic can leave the namespaces made
here: there is no link to the outside and no route out. Commands run inside a host with
``ip netns exec NAME argv...``; ``ip`` execs the command without forking, so the process a caller starts
that way *is* the command (its PID is the real one).

Partitions are nft drop rules on the switch's forward hook (``iifname "p1" oifname "p3" drop``, both
directions); ARP crosses the same hook, so a partitioned pair cannot reach each other at all, multicast
(mDNS) included. ``heal`` flushes the rules. (``tc netem`` needs kernel modules this machine cannot load.)

``close`` kills whatever still runs inside the namespaces and deletes them; creating a LAN first deletes
the namespaces of earlier runs whose creating process is gone (a crashed test), killing their leftover
processes. Namespaces of a live process (another test run in parallel) are left alone.

Needs root, iproute2 and nftables (``apt-get install iproute2 nftables``). :func:`unavailable_reason`
says why not, for a ``pytest.skip``; :class:`NetnsUnavailable` is raised when the kernel refuses
``ip netns add`` or nf_tables.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PREFIX = "ldlan"
SUBNET = "10.77.0"  # private, and only ever configured inside namespaces made here
NFT_TABLE = "ldlan"
NFT_CHAIN = "partition"
NETNS_DIR = Path("/run/netns")
_COMMAND_TIMEOUT_S = 20.0
_STALE = re.compile(rf"^{PREFIX}(\d+)x\d+-")
_counter = itertools.count(1)


class NetnsUnavailable(Exception):
    """This machine cannot make the namespaces or the nft rules (the message says why)."""


def unavailable_reason() -> str | None:
    """Why a LAN cannot be built here, without touching anything; None if it may work."""
    if os.geteuid() != 0:
        return f"network namespaces need root (running as uid {os.geteuid()})"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed: apt-get install iproute2"
    if shutil.which("nft") is None:
        return "`nft` (nftables) is not installed: apt-get install nftables"
    return None


def run(
    argv: Sequence[str], *, stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run a command to completion (bounded), capturing its output; raises with stderr on failure."""
    done = subprocess.run(
        list(argv), input=stdin, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S, check=False
    )
    if check and done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, list(argv), done.stdout, done.stderr)
    return done


def list_netns() -> list[str]:
    """Names of the named network namespaces (``ip netns list``)."""
    out = run(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def netns_pids(name: str) -> list[int]:
    """Processes running inside a namespace."""
    done = run(["ip", "netns", "pids", name], check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _delete_netns(name: str) -> None:
    """Kill what runs inside, then delete the name (the namespace dies with its last process)."""
    for pid in netns_pids(name):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    run(["ip", "netns", "delete", name], check=False)


def delete_stale() -> list[str]:
    """Delete namespaces left by earlier runs (named ``ldlan<pid>x<n>-*``) whose process is gone."""
    removed = []
    for name in list_netns():
        match = _STALE.match(name)
        if match and not _pid_alive(int(match.group(1))):
            _delete_netns(name)
            removed.append(name)
    return removed


def netns_inode(name: str) -> int:
    """The namespace's inode: compare with ``os.stat(f"/proc/{pid}/ns/net").st_ino``."""
    return (NETNS_DIR / name).stat().st_ino


@dataclass(frozen=True)
class Host:
    """One host of the LAN: a namespace with ``eth0`` on the switch."""

    name: str  # h1, h2, ...
    netns: str
    address: str  # 10.77.0.N
    port: str  # its switch port, pN

    def cmd(self, *argv: str) -> list[str]:
        """``argv`` run inside this host."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run(self.cmd(*argv), check=check)

    def pids(self) -> list[int]:
        return netns_pids(self.netns)


@dataclass
class Lan:
    """A switch namespace with a bridge and ``hosts`` host namespaces; a context manager."""

    hosts: int = 3
    prefix: str = field(default_factory=lambda: f"{PREFIX}{os.getpid()}x{next(_counter)}-")
    members: dict[str, Host] = field(default_factory=dict, init=False)
    created: list[str] = field(default_factory=list, init=False)
    setup_s: float = field(default=0.0, init=False)

    @property
    def switch(self) -> str:
        return f"{self.prefix}sw"

    def __getitem__(self, name: str) -> Host:
        return self.members[name]

    def __enter__(self) -> Lan:
        if not self.members:
            self.create()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ building and tearing down
    def _add_netns(self, name: str) -> None:
        done = run(["ip", "netns", "add", name], check=False)
        if done.returncode != 0:
            raise NetnsUnavailable(f"`ip netns add {name}` failed: {done.stderr.strip() or done.returncode}")
        self.created.append(name)
        run(["ip", "-n", name, "link", "set", "lo", "up"])

    def create(self) -> None:
        if not 1 <= self.hosts <= 250:
            raise ValueError(f"hosts must be in 1..250, got {self.hosts}")
        reason = unavailable_reason()
        if reason is not None:
            raise NetnsUnavailable(reason)
        started = time.monotonic()
        delete_stale()
        try:
            sw = self.switch
            self._add_netns(sw)
            run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0"])
            run(["ip", "-n", sw, "link", "set", "br0", "up"])
            ruleset = (
                f"table bridge {NFT_TABLE} {{\n"
                f"  chain {NFT_CHAIN} {{ type filter hook forward priority 0; policy accept; }}\n"
                "}\n"
            )
            done = run(["ip", "netns", "exec", sw, "nft", "-f", "-"], stdin=ruleset, check=False)
            if done.returncode != 0:
                raise NetnsUnavailable(f"nft cannot make a bridge table: {done.stderr.strip()}")
            for i in range(1, self.hosts + 1):
                host = Host(f"h{i}", f"{self.prefix}h{i}", f"{SUBNET}.{i}", f"p{i}")
                self._add_netns(host.netns)
                run(["ip", "-n", sw, "link", "add", host.port, "type", "veth", "peer", "name", "eth0",
                     "netns", host.netns])  # fmt: skip
                run(["ip", "-n", sw, "link", "set", host.port, "master", "br0", "up"])
                run(["ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0"])
                run(["ip", "-n", host.netns, "link", "set", "eth0", "up"])
                self.members[host.name] = host
        except BaseException:
            self.close()
            raise
        self.setup_s = time.monotonic() - started

    def close(self) -> None:
        """Delete everything this LAN made (idempotent); processes still inside are killed."""
        for name in reversed(self.created):
            _delete_netns(name)
        left = set(self.created) & set(list_netns())
        self.created = [n for n in self.created if n in left]
        if left:
            raise RuntimeError(f"network namespaces not deleted: {sorted(left)}")

    # ------------------------------------------------------------------ partitions
    def _nft(self, script: str) -> None:
        run(["ip", "netns", "exec", self.switch, "nft", "-f", "-"], stdin=script)

    def partition(self, side_a: Iterable[str], side_b: Iterable[str]) -> None:
        """Drop every frame between a host of ``side_a`` and one of ``side_b`` (both directions)."""
        a = [self.members[n].port for n in side_a]
        b = [self.members[n].port for n in side_b]
        rules = [
            f'add rule bridge {NFT_TABLE} {NFT_CHAIN} iifname "{x}" oifname "{y}" counter drop'
            for p, q in itertools.product(a, b)
            for x, y in ((p, q), (q, p))
        ]
        self._nft("\n".join(rules) + "\n")

    def heal(self) -> None:
        """Remove every partition rule."""
        self._nft(f"flush chain bridge {NFT_TABLE} {NFT_CHAIN}\n")

    def dropped(self) -> dict[tuple[str, str], int]:
        """Packets dropped so far by the current partition rules, per (in port, out port)."""
        out = run(["ip", "netns", "exec", self.switch, "nft", "-j", "list", "chain", "bridge", NFT_TABLE,
                   NFT_CHAIN]).stdout  # fmt: skip
        counts: dict[tuple[str, str], int] = {}
        for item in json.loads(out).get("nftables", []):
            rule = item.get("rule")
            if rule is None:
                continue
            ports: dict[str, str] = {}
            packets = 0
            for expr in rule.get("expr", []):
                match: Any = expr.get("match")
                if match is not None:
                    meta = match.get("left", {}).get("meta", {}).get("key")
                    if meta in ("iifname", "oifname"):
                        ports[meta] = str(match.get("right"))
                counter = expr.get("counter")
                if counter is not None:
                    packets = int(counter.get("packets", 0))
            counts[(ports.get("iifname", "?"), ports.get("oifname", "?"))] = packets
        return counts
