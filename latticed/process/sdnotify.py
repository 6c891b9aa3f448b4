"""Minimal stdlib ``sd_notify``: tell systemd we are ready, stopping, alive, and what we are doing.

The protocol is one ``KEY=VALUE`` datagram per call to the ``AF_UNIX`` socket named by ``NOTIFY_SOCKET``
(a path, or ``@name`` for the abstract namespace). Without ``NOTIFY_SOCKET`` (not under systemd, or
``Type=simple``) every call is a no-op, so the daemon calls these unconditionally. A failed send is
logged and swallowed: losing a status line must never take the daemon down.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)

#: Bounded so a wedged service manager cannot stall the event loop for long.
SEND_TIMEOUT_S = 2.0


class Notifier:
    """A connection-less sender to systemd's notify socket; cheap, reusable, not thread-safe."""

    def __init__(self, address: str | bytes | None) -> None:
        """``address`` is a filesystem path or ``\\0``-prefixed abstract name; None disables sending."""
        self._address = address
        self._sock: socket.socket | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Notifier:
        """Read ``NOTIFY_SOCKET``; an unset or unsupported value yields a disabled notifier."""
        raw = env.get("NOTIFY_SOCKET", "")
        if not raw:
            return cls(None)
        if raw.startswith("@"):
            return cls("\0" + raw[1:])
        if raw.startswith("/"):
            return cls(raw)
        # e.g. "vsock:CID:PORT" (systemd >= 253), meant for VMs; not something latticed runs in.
        log.warning("unsupported NOTIFY_SOCKET %r; not notifying systemd", raw)
        return cls(None)

    @property
    def enabled(self) -> bool:
        """True when there is a socket to talk to."""
        return self._address is not None

    def notify(self, *assignments: str) -> bool:
        """Send ``KEY=VALUE`` lines in one datagram; returns whether it was sent (False when disabled)."""
        if self._address is None:
            return False
        payload = "\n".join(assignments).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sock.settimeout(SEND_TIMEOUT_S)
            self._sock.sendto(payload, self._address)
        except OSError as exc:
            log.warning("sd_notify %r failed: %s", payload[:64], exc)
            self.close()
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        """Start-up finished: systemd marks the unit active and starts units ordered after it."""
        return self.notify("READY=1", *(() if status is None else (_status_line(status),)))

    def stopping(self) -> bool:
        """Shutdown began; systemd shows "deactivating" instead of thinking we hung."""
        return self.notify("STOPPING=1")

    def status(self, text: str) -> bool:
        """One free-form line shown by ``systemctl status``."""
        return self.notify(_status_line(text))

    def watchdog(self) -> bool:
        """Keep-alive ping; send it every :func:`watchdog_interval` seconds or systemd restarts us."""
        return self.notify("WATCHDOG=1")

    def close(self) -> None:
        """Release the socket; a later call opens a new one."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _status_line(text: str) -> str:
    # A newline would end the STATUS= assignment and start a bogus one.
    return "STATUS=" + " ".join(text.splitlines())


def watchdog_interval(env: Mapping[str, str] = os.environ, pid: int | None = None) -> float | None:
    """Seconds between watchdog pings (half of ``WATCHDOG_USEC``), or None when no watchdog is armed.

    ``WATCHDOG_PID``, when set, names the process the watchdog is for; anyone else (a child that
    inherited the environment) must not ping. ``pid`` defaults to this process.
    """
    usec_text = env.get("WATCHDOG_USEC", "")
    if not usec_text:
        return None
    pid_text = env.get("WATCHDOG_PID", "")
    try:
        usec = int(usec_text)
        watched = int(pid_text) if pid_text else None
    except ValueError:
        log.warning("ignoring malformed WATCHDOG_USEC=%r WATCHDOG_PID=%r", usec_text, pid_text)
        return None
    if watched is not None and watched != (os.getpid() if pid is None else pid):
        return None
    if usec <= 0:
        return None
    return usec / 2_000_000


__all__ = ["SEND_TIMEOUT_S", "Notifier", "watchdog_interval"]
