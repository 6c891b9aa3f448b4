"""Peer addresses: ``(host, port)`` pairs and their ``HOST:PORT`` text form (IPv6 in brackets).

Pure and shared by the config, the peer book, discovery and invitations, so an address means one thing
everywhere.
"""

from __future__ import annotations

from latticed.errors import MalformedError

#: A peer's address: host (name or IP literal, no brackets) and port.
HostPort = tuple[str, int]


def parse_host_port(text: str, *, allow_port_zero: bool = False) -> HostPort:
    """Parse ``HOST:PORT``; IPv6 literals need brackets (``[::1]:7000``) because of their colons."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or text[end + 1 : end + 2] != ":":
            raise MalformedError(f"{text!r}: expected [IPV6]:PORT")
        host, port_text = text[1:end], text[end + 2 :]
        if ":" not in host:
            raise MalformedError(f"{text!r}: brackets are only for IPv6 addresses")
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise MalformedError(f"{text!r}: expected HOST:PORT")
        if ":" in host:
            raise MalformedError(f"{text!r}: write IPv6 addresses in brackets, e.g. [::1]:7000")
    if not host:
        raise MalformedError(f"{text!r}: missing host (use 0.0.0.0 or [::] for all interfaces)")
    if not port_text.isascii() or not port_text.isdigit():
        raise MalformedError(f"{text!r}: port must be a number")
    port = int(port_text)
    if not (0 if allow_port_zero else 1) <= port <= 65535:
        raise MalformedError(f"{text!r}: port {port} out of range")
    return host, port


__all__ = ["HostPort", "parse_host_port"]
