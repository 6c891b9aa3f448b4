"""Which IPv4 addresses mDNS runs on, from the ``mdns_interfaces`` config key.

One definition for the daemon's discovery and for ``latticectl doctor``; it imports neither trio nor
zeroconf, so the doctor can use it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

import ifaddr

from latticed.errors import MalformedError


def mdns_interfaces(interfaces: Sequence[str]) -> list[tuple[str, str]]:
    """``(IPv4 address, interface name)`` to run mDNS on (and advertise) for ``mdns_interfaces``.

    Each entry is an IPv4 address or an interface name (``eth0``). Empty means every non-loopback IPv4
    address; if there is none (a container with only ``lo``), loopback, so daemons on one host still find
    each other. IPv6 is not supported yet: its link-local addresses need scope ids end to end.
    """
    adapters = ifaddr.get_adapters()
    out: list[tuple[str, str]] = []
    if not interfaces:
        for adapter in adapters:
            for ip in adapter.ips:
                if isinstance(ip.ip, str) and not ipaddress.IPv4Address(ip.ip).is_loopback:
                    out.append((ip.ip, adapter.nice_name))
        return list(dict.fromkeys(out)) or [("127.0.0.1", "loopback")]
    for entry in interfaces:
        try:
            literal = ipaddress.ip_address(entry)
        except ValueError:
            literal = None
        if literal is not None:
            if literal.version != 4:
                raise MalformedError(
                    f"config key 'mdns_interfaces': {entry!r}: IPv6 mDNS is not supported yet"
                )
            names = [a.nice_name for a in adapters for ip in a.ips if ip.ip == str(literal)]
            out.append((str(literal), names[0] if names else "?"))
            continue
        matches = [a for a in adapters if entry in (a.name, a.nice_name)]
        if not matches:
            raise MalformedError(f"config key 'mdns_interfaces': no interface or IPv4 address {entry!r}")
        ipv4 = [(ip.ip, a.nice_name) for a in matches for ip in a.ips if isinstance(ip.ip, str)]
        if not ipv4:
            raise MalformedError(f"config key 'mdns_interfaces': interface {entry!r} has no IPv4 address")
        out.extend(ipv4)
    return list(dict.fromkeys(out))


def mdns_addresses(interfaces: Sequence[str]) -> list[str]:
    """The addresses of :func:`mdns_interfaces`, without the names."""
    return list(dict.fromkeys(address for address, _ in mdns_interfaces(interfaces)))


__all__ = ["mdns_addresses", "mdns_interfaces"]
