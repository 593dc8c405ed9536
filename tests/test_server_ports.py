"""Which ports a server takes: Triton's 8000/8001/8002 when free, free ones (said) when taken, the user's
when given — and a busy port the user chose is refused before any model loads. Real sockets on 127.0.0.1."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ftx.triton.ports import TRITON_PORTS, ServerPorts, busy_ports, choose_ports, port_free


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    """A socket listening on a free port of 127.0.0.1 (a port somebody else holds)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock


def _hold(port: int) -> socket.socket:
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        pytest.skip(f"port {port} is already in use on this machine")
    sock.listen()
    return sock


def test_triton_defaults_when_free() -> None:
    if not all(port_free("127.0.0.1", p) for p in (8000, 8001, 8002)):
        pytest.skip("Triton's default ports are in use on this machine")
    assert choose_ports("127.0.0.1") == (TRITON_PORTS, None) == (ServerPorts(8000, 8001, 8002), None)


def test_taken_defaults_give_free_ports_and_say_which() -> None:
    with _hold(8001):
        ports, note = choose_ports("127.0.0.1")
        assert 8001 not in (ports.http, ports.grpc, ports.metrics) and len({ports.http, ports.grpc, ports.metrics}) == 3
        assert note is not None and "8001" in note and "--http-port" in note
        ports, _ = choose_ports("127.0.0.1", http=9123)  # a port given is kept
        assert ports.http == 9123


def test_given_ports_are_kept_and_busy_ones_found(listening: socket.socket) -> None:
    port = listening.getsockname()[1]
    ports, note = choose_ports("127.0.0.1", port, 1, 2)
    assert ports == ServerPorts(port, 1, 2) and note is None
    assert port in busy_ports("127.0.0.1", ports)


def test_a_busy_port_given_to_ftx_run_fails_before_any_model_loads(ftx_cli: Any, ftx_home: Path,
                                                                   tiny_gptj_dir: Path,
                                                                   listening: socket.socket) -> None:
    port = listening.getsockname()[1]
    result = ftx_cli("run", str(tiny_gptj_dir), "--runtime", "python", "--http-port", str(port), "--no-openai")
    assert result.exit_code == 1
    assert f"port(s) {port} on 127.0.0.1 are in use" in result.stderr and "hint:" in result.stderr
    assert "loading model" not in result.stderr and "starting tritonserver" not in result.stderr
    logs = ftx_home / "triton" / "logs"
    assert not logs.exists() or not list(logs.glob("*.log"))  # no tritonserver was started
