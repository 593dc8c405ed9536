"""Where a local tritonserver listens (Triton's ports, or free ones) and how a client on this machine
reaches it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import socket
from collections.abc import Callable, Collection
from dataclasses import astuple, dataclass
from typing import TYPE_CHECKING

from ftx_triton.errors import ConfigError, ServeError

if TYPE_CHECKING:
    import urllib.request

# --------------------------------------------------------------------------- ports


@dataclass(frozen=True)
class ServerPorts:
    """The three ports a tritonserver listens on."""

    http: int
    grpc: int
    metrics: int


TRITON_PORTS = ServerPorts(8000, 8001, 8002)
"""Triton's own defaults (HTTP, gRPC, metrics), what its clients and guides assume."""


def address_family(address: str) -> socket.AddressFamily:
    """The socket family of a literal address or host name (IPv6 when it has a colon)."""
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def port_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``port`` of ``host`` right now.

    Probed with SO_REUSEADDR, as tritonserver's HTTP, gRPC and metrics listeners bind: connections of a
    server that just stopped linger in TIME_WAIT on its port for a minute, and they block a plain bind but
    not a server's, so without it a second run right after the first would move off Triton's ports.
    """
    address = (host or "0.0.0.0").strip("[]")  # the address the server binds: all interfaces for 0.0.0.0
    with socket.socket(address_family(address), socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError:
            return False
    return True


def check_host(host: str, option: str = "--host") -> None:
    """Refuse a host (given as ``option``) that does not resolve, or is no address of this machine, before
    any server starts."""
    try:
        with socket.socket(address_family(host), socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
    except (OSError, ValueError) as exc:  # gaierror, EADDRNOTAVAIL; ValueError: a NUL or an over-long label
        if isinstance(exc, OSError) and not isinstance(exc, socket.gaierror) and exc.errno != errno.EADDRNOTAVAIL:
            raise
        why = (
            "is no address of this machine"
            if isinstance(exc, OSError) and exc.errno == errno.EADDRNOTAVAIL
            else "does not resolve to an address"
        )
        raise ConfigError(
            f"{option} {host!r} {why}",
            hint="pass an address of this machine: 127.0.0.1 (this machine only), 0.0.0.0 (every "
            "interface), ::1, :: or one of its own IPs or host names",
        ) from exc


def choose_ports(
    host: str,
    http: int | None = None,
    grpc: int | None = None,
    metrics: int | None = None,
    *,
    held: ServerPorts | None = None,
) -> tuple[ServerPorts, str | None]:
    """The ports a server should take, and a sentence for the user when they are not the usual ones.

    Ports given are kept; the others are Triton's 8000/8001/8002 when all three are free, else free ones
    (the sentence says which defaults were taken). ``held``: the ports a server started ahead for this very run
    holds (:mod:`~ftx_triton.server.head_start`): none of them counts as in use, and they are the free ones taken.
    """
    check_host(host)
    wanted = (http, grpc, metrics)
    if all(p is not None for p in wanted):
        return ServerPorts(*wanted), None  # type: ignore[arg-type]
    taken = [p for p in busy_ports(host, TRITON_PORTS) if held is None or p not in astuple(held)]
    defaults, note = TRITON_PORTS, None
    if taken:
        defaults = held or free_ports(client_host(host).strip("[]"))
        note = (
            f"Triton's usual port(s) {', '.join(map(str, taken))} are in use on {client_host(host)}; "
            "taking free ones (pass --http-port/--grpc-port/--metrics-port to choose)"
        )
    chosen = (
        w if w is not None else d for w, d in zip(wanted, (defaults.http, defaults.grpc, defaults.metrics), strict=True)
    )
    return ServerPorts(*chosen), note


def ports_for(
    host: str,
    http: int | None = None,
    grpc: int | None = None,
    metrics: int | None = None,
    say: Callable[[str], None] | None = None,
    *,
    held: ServerPorts | None = None,
) -> tuple[ServerPorts, bool]:
    """The ports a local tritonserver takes (see :func:`choose_ports`, ``held`` too; a change from Triton's usual
    ones is said) and whether the user gave any. A port the user gave that is busy fails now, before any model
    loads."""
    given = {http, grpc, metrics} - {None}
    ports, note = choose_ports(host, http, grpc, metrics, held=held)
    if busy := [p for p in busy_ports(host, ports) if p in given and (held is None or p not in astuple(held))]:
        raise ServeError(
            f"port(s) {', '.join(map(str, busy))} on {host} are in use",
            hint="pass free --http-port/--grpc-port/--metrics-port, or leave them out "
            "(ftx takes Triton's 8000-8002, or free ones when those are taken)",
        )
    if note and say is not None:
        say(note)
    return ports, bool(given)


def busy_ports(host: str, ports: ServerPorts) -> list[int]:
    """Which of ``ports`` cannot be bound on ``host`` now (checked before any model loads)."""
    return [p for p in (ports.http, ports.grpc, ports.metrics) if not port_free(host, p)]


def free_ports(host: str = "127.0.0.1") -> ServerPorts:
    """Return three distinct TCP ports that are free on ``host`` right now."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(3):
            sock = stack.enter_context(socket.socket(address_family(host), socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
    return ServerPorts(*ports)


def _any_loopback_port() -> int:
    """A port the kernel hands out as free on 127.0.0.1 now (the socket is closed again at once)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def loopback_port(avoid: Collection[int] = ()) -> int:
    """A free port on 127.0.0.1 (tritonserver's own HTTP or gRPC port behind a front) that is none of ``avoid``:
    the ports this server takes already, which are not bound yet when it is picked, so the kernel may hand one
    out again (seen: tritonserver started with its gRPC and metrics ports equal, and refused)."""
    for _ in range(100):
        port = _any_loopback_port()
        if port not in avoid:
            return port
    raise ServeError("no free port on 127.0.0.1", hint="free some local ports, then run the command again")


# --------------------------------------------------------------------------- HTTP probes


@functools.cache
def _opener() -> urllib.request.OpenerDirector:
    """An opener that never goes through a proxy (urllib is imported when a server is first asked)."""
    import urllib.request

    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_ok(url: str, timeout_s: float = 2.0, *, signed: tuple[str, str] | None = None) -> bool:
    """True if GET ``url`` answers 200 (a fresh connection each time: no keep-alive left open), with the header
    ``signed`` = (name, value) when given (the answer of one process, not of whoever holds the port)."""
    import urllib.error

    try:
        with _opener().open(url, timeout=timeout_s) as response:
            if signed is not None and response.headers.get(signed[0]) != signed[1]:
                return False
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def client_host(host: str) -> str:
    """The address a client on this machine uses to reach a server bound to ``host``."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host
