"""Whether the replication port is free, and what to say when it is not.

Two daemons on one host (two users' ``latticed init --user``) would both take the default port; the second
would die on "Address already in use" after opening its whole store. So ``latticed run`` probes the port
before it imports or opens anything, ``latticed init`` picks the next free port when the default is taken,
and the message names the address and the two ways out. Plain sockets, no trio: the CLI calls it first.
"""

from __future__ import annotations

import errno
import socket
from pathlib import Path
from typing import Final

from latticed.errors import LatticedError
from latticed.protocol.addresses import HostPort
from latticed.protocol.peerstate import format_host_port

#: How many ports above the default ``latticed init`` tries before it gives up.
INIT_PORT_TRIES: Final = 32


def listen_error(address: HostPort, exc: OSError, *, config_file: Path | None = None) -> LatticedError:
    """The one-line error for a listen address that cannot be bound, with what to do about it."""
    host, port = address
    shown = format_host_port(address)
    where = f"edit listen in {config_file}" if config_file is not None else "set listen in the config"
    any_port = format_host_port((host, 0))
    if exc.errno == errno.EADDRINUSE:
        return LatticedError(
            f"cannot listen on {shown}: port {port} is in use (another latticed, maybe another user's, or "
            f"another program); {where} to a free port, or run with --listen {any_port} (any free port)"
        )
    return LatticedError(f"cannot listen on {shown}: {exc.strerror or exc}; {where} (--listen HOST:PORT)")


def probe_listen(address: HostPort, *, config_file: Path | None = None) -> None:
    """Raise :func:`listen_error` if the daemon could not bind ``address`` now (port 0 always binds).

    Binds as the daemon's listener does (``SO_REUSEADDR``, IPv6 sockets IPv6 only) and lets go at once."""
    host, port = address
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise LatticedError(f"cannot listen on {format_host_port(address)}: {exc.strerror or exc}") from exc
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                probe.bind(sockaddr)
        except OSError as exc:
            raise listen_error(address, exc, config_file=config_file) from exc


def first_free_listen(address: HostPort, tries: int = INIT_PORT_TRIES) -> HostPort | None:
    """``address`` if it binds, else the first of the next ``tries`` ports that does; None if none."""
    host, port = address
    if port == 0:
        return address
    for candidate in range(port, min(port + tries + 1, 65536)):
        try:
            probe_listen((host, candidate))
        except LatticedError:
            continue
        return host, candidate
    return None


__all__ = ["INIT_PORT_TRIES", "first_free_listen", "listen_error", "probe_listen"]
