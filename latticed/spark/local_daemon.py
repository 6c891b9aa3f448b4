"""Reaching the local daemon from a Spark driver or executor.

The ``socket`` option is resolved where it is used, not where the query is defined: executors run
``read()`` on their own hosts and must talk to the daemon *of that host* (which holds a replica), so the
option travels unresolved inside each partition and :func:`resolve_socket` runs on the executor.
"""

from __future__ import annotations

import os
import re
import socket as socket_mod
from collections.abc import Mapping
from pathlib import Path

from latticed.api.client.blocking_client import Client
from latticed.errors import ConnectionClosedError, NotFoundError
from latticed.host.config import default_socket_path
from latticed.spark.offsets import QueueView

_VAR = re.compile(r"\$\{(\w+)\}|\$(\w+)")


def resolve_socket(option: str | None, env: Mapping[str, str] = os.environ, host: str | None = None) -> Path:
    """The socket path on this host.

    Empty or unset: as the CLI resolves it (``LATTICED_SOCKET``, ``RUNTIME_DIRECTORY``, XDG, /tmp). Else
    ``{host}`` becomes this host's short name, ``$VAR``/``${VAR}`` come from this host's environment and
    ``~`` is expanded; so ``/run/latticed/{host}.sock`` or ``$LATTICED_SOCKET`` name a per-host path.
    """
    if not option:
        return default_socket_path(env)
    name = host if host is not None else socket_mod.gethostname().split(".")[0]
    text = _VAR.sub(lambda m: env.get(m.group(1) or m.group(2), m.group(0)), option.replace("{host}", name))
    if text == "~" or text.startswith("~/"):
        text = env.get("HOME", os.path.expanduser("~")) + text[1:]
    return Path(text)


def connect(option: str | None, timeout: float) -> Client:
    """A client of this host's daemon, connected now so a missing daemon fails with a clear message."""
    path = resolve_socket(option)
    client = Client(path, timeout=timeout)
    try:
        client.api_versions()  # a hello, kept: the sink picks its request form by it
    except ConnectionClosedError as exc:
        client.close()
        host = socket_mod.gethostname()
        raise ConnectionClosedError(
            f"{exc} (host {host}). The lattice source reads through the latticed daemon of each host that "
            "runs a Spark driver or executor: start latticed there, or point the 'socket' option (or "
            "LATTICED_SOCKET) at its socket."
        ) from exc
    return client


def list_views(client: Client) -> list[QueueView]:
    """Every queue the daemon holds, in one round trip."""
    return [QueueView.from_info(info) for info in client.queue_list()]


def resolve_queues(client: Client, specs: tuple[str, ...]) -> dict[str, str]:
    """``NAME`` (one of this daemon's own queues) or ``OWNER/NAME`` -> ``OWNER/NAME``, checked to exist."""
    out: dict[str, str] = {}
    for spec in specs:
        try:
            info = client.queue_info(spec)
        except NotFoundError as exc:
            where = "on the local daemon" if "/" in spec else "among this daemon's own queues"
            raise NotFoundError(f"lattice source: unknown queue {spec!r} {where} ({exc})") from exc
        out[spec] = str(info["queue"])
    return out


__all__ = ["connect", "list_views", "resolve_queues", "resolve_socket"]
