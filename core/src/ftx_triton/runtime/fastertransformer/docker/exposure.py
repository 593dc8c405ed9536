"""Which addresses a FasterTransformer tritonserver listens on, and what it restricts when that is wider.

ftx binds 127.0.0.1 unless the user asks for another address. Every endpoint follows that address:
HTTP, gRPC, and metrics (tritonserver up to 23.05 serves metrics on the HTTP address; from 23.06 it has
its own ``--metrics-address``, which defaults to all interfaces and so must be passed). When the address
is wider than loopback, the administrative APIs (model repository, shared memory, logging, trace) are
restricted to requests carrying a key, where the image's tritonserver has restricted-API options
(24.01 and later); older images cannot restrict them, which the plan says.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from ftx_triton.front.addresses import is_loopback
from ftx_triton.server.admin_apis import ADMIN_APIS, ADMIN_KEY_HEADER, admin_restriction

METRICS_ADDRESS_SINCE = (23, 6)
RESTRICTED_API_SINCE = (24, 1)
_VERSION = re.compile(r"(?<![\d.])(\d{2})\.(\d{2})(?![\d.])")


def triton_version_of(image: str) -> tuple[int, int] | None:
    """The Triton release (YY, MM) an image tag names (``tritonserver:23.05-py3``, ``ftx-ft:24.01``), if any."""
    tag = image.rsplit("/", 1)[-1].partition(":")[2]
    match = _VERSION.search(tag)
    return (int(match.group(1)), int(match.group(2))) if match else None


@dataclass(frozen=True)
class Exposure:
    """tritonserver's address arguments, the key guarding its admin APIs (if any) and a caveat to tell the user."""

    flags: tuple[str, ...]
    admin_key: str | None = None
    caveat: str | None = None


def exposure_for(host: str, triton_version: tuple[int, int] | None, *, admin_key: str | None = None) -> Exposure:
    """The address flags for ``host`` on a tritonserver of ``triton_version`` (None: unknown, assumed old)."""
    host = host or "0.0.0.0"
    flags = [f"--http-address={host}", f"--grpc-address={host}"]
    if triton_version is not None and triton_version >= METRICS_ADDRESS_SINCE:
        flags.append(f"--metrics-address={host}")
    if is_loopback(host):
        return Exposure(tuple(flags))
    if triton_version is None or triton_version < RESTRICTED_API_SINCE:
        shown = (
            "of an unknown version" if triton_version is None else f"{triton_version[0]:02d}.{triton_version[1]:02d}"
        )
        return Exposure(
            tuple(flags),
            caveat=(
                f"tritonserver {shown} cannot restrict its {ADMIN_APIS} APIs: anyone who reaches {host} can use them; "
                f"bind 127.0.0.1 behind a proxy, or build the image on Triton 24.01 or later"
            ),
        )
    key = admin_key or secrets.token_urlsafe(18)
    restriction = admin_restriction(key)
    flags += [f"--http-restricted-api={restriction}", f"--grpc-restricted-protocol={restriction}"]
    return Exposure(tuple(flags), admin_key=key)


__all__ = [
    "ADMIN_APIS",
    "ADMIN_KEY_HEADER",
    "METRICS_ADDRESS_SINCE",
    "RESTRICTED_API_SINCE",
    "Exposure",
    "exposure_for",
    "is_loopback",
    "triton_version_of",
]
