"""The replication service's knowledge of peer faults, with its I/O: the rules file and the log lines.

The pure parts (classification, hysteresis, what a peer's state is) are in
:mod:`latticed.protocol.peerstate`; this module feeds them from the dialler, the listener and the
handshake, writes ``peer_rules.json`` (the operator's added peers and blocked identities) atomically, and
logs each fault once when it starts, not on every retry.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from latticed.errors import (
    ConnectionClosedError,
    HandshakeError,
    LatticedError,
    MalformedError,
    StorageError,
)
from latticed.process.logs import get_logger, log_event
from latticed.protocol.addresses import HostPort
from latticed.protocol.peerstate import (
    ClockSkew,
    DialFailure,
    IncomingRefusals,
    PeerRules,
    SkewReading,
    classify_dial_failure,
    format_host_port,
)

log = get_logger(__name__)

__all__ = ["RULES_FILE", "PeerFaults", "load_rules", "save_rules"]

RULES_FILE = "peer_rules.json"


def load_rules(data_dir: Path) -> PeerRules:
    """The saved rules (none yet: empty). A file that does not parse stops the start: running without its
    block list would let blocked peers back in."""
    path = data_dir / RULES_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return PeerRules()
    except OSError as exc:
        raise StorageError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        return PeerRules.from_json(text)
    except MalformedError as exc:
        raise MalformedError(
            f"{path}: {exc}; fix it or move it away (it holds the peers added with `latticectl peers add` "
            "and the blocked identities)"
        ) from None


def save_rules(data_dir: Path, rules: PeerRules) -> None:
    """Write the rules durably (temporary file, fsync, rename, fsync of the directory): a block must
    survive a crash right after ``latticectl peers block`` said it was done."""
    path = data_dir / RULES_FILE
    tmp = path.with_suffix(".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            os.write(fd, rules.to_json().encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        tmp.replace(path)
        dir_fd = os.open(data_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise StorageError(f"cannot save {path}: {exc.strerror or exc}") from exc


@dataclass
class PeerFaults:
    """Rules, dial failures, refused handshakes and clock skew of one replication service."""

    data_dir: Path
    #: ``allowed_peers`` from the config, or None when any holder of the network key may connect.
    allowed: frozenset[bytes] | None = None
    rules: PeerRules = field(default_factory=PeerRules)
    failures: dict[HostPort, DialFailure] = field(default_factory=dict)
    incoming: IncomingRefusals = field(default_factory=IncomingRefusals)
    skew: ClockSkew = field(default_factory=ClockSkew)

    @classmethod
    def load(cls, data_dir: Path, allowed: frozenset[bytes] | None) -> PeerFaults:
        return cls(data_dir, allowed, load_rules(data_dir))

    # ------------------------------------------------------------------ rules
    def admits(self, public_key: bytes) -> bool:
        """The handshake's allow check (both roles): not blocked, and allowed if there is a list."""
        return self.rules.admits(public_key, self.allowed)

    def update_rules(self, rules: PeerRules) -> None:
        """Save first, then apply: what the operator was told is done is on disk."""
        if rules != self.rules:
            save_rules(self.data_dir, rules)
            self.rules = rules

    # ------------------------------------------------------------------ dialling
    def dial_failed(
        self, address: HostPort, error: LatticedError, *, reached: bool, we_refused: bytes | None
    ) -> DialFailure:
        """Record why a dial failed; a new kind of failure for this address is logged once."""
        now = time.time()
        failure = classify_dial_failure(
            reached=reached,
            message=str(error),
            at=now,
            handshake_error=isinstance(error, HandshakeError),
            waiting_for=error.waiting_for if isinstance(error, HandshakeError) else None,
            we_refused=we_refused,
            blocked=self.rules.blocked,
        )
        previous = self.failures.get(address)
        self.failures[address] = failure
        if previous is None or previous.kind != failure.kind:
            log_event(
                log,
                "peer.refused" if failure.refused else "peer.unreachable",
                level=logging.WARNING if failure.refused else logging.INFO,
                address=format_host_port(address),
                kind=failure.kind,
                reason=failure.reason,
                error=str(error),
            )
        return failure

    def dial_succeeded(self, address: HostPort) -> None:
        if self.failures.pop(address, None) is not None:
            log_event(log, "peer.reachable", address=format_host_port(address))

    def forget(self, addresses: list[HostPort]) -> None:
        for address in addresses:
            self.failures.pop(address, None)

    def unblocked(self, public_key: bytes) -> None:
        """``public_key`` left the block list: what we refused it for is no longer so, drop it now
        rather than show "on our block list" until the next dial or for the refusals' whole window."""
        stale = [
            a
            for a, f in self.failures.items()
            if f.kind == "blocked" and f.reason.startswith(public_key.hex())
        ]
        for address in stale:
            del self.failures[address]
        self.incoming.forget(public_key)

    # ------------------------------------------------------------------ accepting
    def incoming_failed(self, host: str, error: LatticedError, refused_key: bytes | None) -> str:
        """A handshake opened to us failed: remember the reason by host (and return it); an authentic
        opening refused as stale also tells us that host's clock offset."""
        now = time.time()
        if refused_key is not None:
            why = "on our block list" if refused_key in self.rules.blocked else "not in our allowed_peers"
            reason = f"we refused {refused_key.hex()}: {why}"
        elif isinstance(error, ConnectionClosedError):
            reason = f"its handshake did not complete: {error}"
        else:
            reason = f"we refused its handshake: {error}"
        self.incoming.refused(host, reason, now, refused_key)
        if isinstance(error, HandshakeError) and error.clock_offset_ms is not None:
            self.clock_observed(host, error.clock_offset_ms, host, None, now)
        return reason

    def incoming_succeeded(
        self, host: str, public_key: bytes, clock_offset_ms: int | None, address: str
    ) -> None:
        self.incoming.accepted(host)
        if clock_offset_ms is not None:
            self.clock_observed(public_key.hex(), clock_offset_ms, address, public_key.hex(), time.time())

    # ------------------------------------------------------------------ clocks
    def clock_observed(
        self, peer: str, offset_ms: int, address: str, public_key: str | None, now: float
    ) -> None:
        change = self.skew.observe(peer, offset_ms, now, address, public_key)
        if change == "skewed":
            log_event(
                log,
                "clock.skew",
                level=logging.WARNING,
                peer=public_key,
                address=address,
                offset_ms=offset_ms,
                hint="this host's clock and the peer's disagree; run NTP (timedatectl) on both. Beyond 2 "
                "minutes their handshakes fail",
            )
        elif change == "recovered":
            log_event(log, "clock.skew_recovered", peer=public_key, address=address, offset_ms=offset_ms)

    def clock_skew(self) -> list[SkewReading]:
        return self.skew.skewed(time.time())
