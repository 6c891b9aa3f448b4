"""Where the local API socket is, for the daemon and every client alike.

Kept apart from :mod:`latticed.host.config` so that a client (``latticectl id``, a Spark planner) finds the
socket without importing the config machinery (TOML parser, logging, file helpers): `latticectl` starts fast.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

SOCKET_NAME = "latticed.sock"


def _get(env: Mapping[str, str], name: str) -> str | None:
    """An environment variable, treating empty as unset (as systemd and XDG do)."""
    value = env.get(name)
    return value if value else None


def default_socket_path(env: Mapping[str, str] = os.environ) -> Path:
    """The local API socket; the daemon and the CLI client resolve it the same way.

    ``$LATTICED_SOCKET``, else ``$RUNTIME_DIRECTORY/latticed.sock`` (systemd), else
    ``$XDG_RUNTIME_DIR/latticed/latticed.sock``, else ``/tmp/latticed-$UID/latticed.sock``.
    """
    explicit = _get(env, "LATTICED_SOCKET")
    if explicit:
        return Path(explicit)
    runtime = _get(env, "RUNTIME_DIRECTORY")
    if runtime:
        return Path(runtime.split(":")[0]) / SOCKET_NAME
    xdg = _get(env, "XDG_RUNTIME_DIR")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "latticed" / SOCKET_NAME
    return Path(f"/tmp/latticed-{os.getuid()}") / SOCKET_NAME


__all__ = ["SOCKET_NAME", "default_socket_path"]
