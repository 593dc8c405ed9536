"""Which client and listening addresses are this machine's own (kept free of aiohttp: the CLI imports it)."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str | None) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ``::1``, ``::ffff:127.0.0.1``)."""
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return bool(address.is_loopback or (mapped is not None and mapped.is_loopback))


__all__ = ["is_loopback"]
