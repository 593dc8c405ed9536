"""Which ports a server takes: Triton's 8000/8001/8002 when free, free ones (said) when taken, the user's
when given — and a busy port the user chose is refused before any model loads. Real sockets on 127.0.0.1."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ftx_triton.errors import ConfigError, ServeError
from ftx_triton.server import ports as ports_module
from ftx_triton.server.ports import (
    TRITON_PORTS,
    ServerPorts,
    busy_ports,
    choose_ports,
    free_ports,
    port_free,
    ports_for,
)
from ftx_triton.server.tritonserver import TritonServer
from triton_helpers import INPUT, add_repository, infer_http


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


def test_ports_a_server_started_ahead_holds_are_its_own_not_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """The head start's early server holds its ports: they count as the run's, and they are the free ones a run
    takes while Triton's usual ones are in use by another; once those are free again, the usual ones are chosen.
    (Triton's usual ports are three free ones here, so that servers on this machine do not decide the test.)"""
    usual = free_ports()
    monkeypatch.setattr(ports_module, "TRITON_PORTS", usual)
    held = free_ports()
    with _hold(usual.http):
        ports, note = choose_ports("127.0.0.1", held=held)
        assert ports == held and note is not None and str(usual.http) in note
    assert choose_ports("127.0.0.1", held=held) == (usual, None)  # a run would take the usual ones
    with _hold(usual.grpc):  # the early server holds the usual ones itself: not "in use"
        assert choose_ports("127.0.0.1", held=usual) == (usual, None)
        with pytest.raises(ServeError, match=str(usual.grpc)):  # held by another, given: refused as ever
            ports_for("127.0.0.1", grpc=usual.grpc)
        assert ports_for("127.0.0.1", grpc=usual.grpc, held=usual)[0] == usual


def test_given_ports_are_kept_and_busy_ones_found(listening: socket.socket) -> None:
    port = listening.getsockname()[1]
    ports, note = choose_ports("127.0.0.1", port, 1, 2)
    assert ports == ServerPorts(port, 1, 2) and note is None
    assert port in busy_ports("127.0.0.1", ports)


def test_a_busy_port_given_to_ftx_run_fails_before_any_model_loads(
    ftx_cli: Any, ftx_home: Path, tiny_gptj_dir: Path, listening: socket.socket
) -> None:
    port = listening.getsockname()[1]
    result = ftx_cli("run", str(tiny_gptj_dir), "--runtime", "python", "--http-port", str(port), "--no-openai")
    assert result.exit_code == 1
    assert f"port(s) {port} on 127.0.0.1 are in use" in result.stderr and "hint:" in result.stderr
    assert "loading model" not in result.stderr and "starting tritonserver" not in result.stderr
    logs = ftx_home / "triton" / "logs"
    assert not logs.exists() or not list(logs.glob("*.log"))  # no tritonserver was started


BAD_HOSTS = {
    "not a host": "does not resolve",
    "[::1]": "does not resolve",
    "a" * 70: "does not resolve",
    "192.0.2.1": "is no address of this machine",
}  # TEST-NET-1: never this machine's


@pytest.mark.parametrize("host", sorted(BAD_HOSTS))
def test_a_host_that_is_no_address_of_this_machine_is_refused(host: str) -> None:
    with pytest.raises(ConfigError) as caught:
        choose_ports(host, 8000, 8001, 8002)  # before any port is probed, even when all three are given
    assert f"--host {host!r} {BAD_HOSTS[host]}" in caught.value.message and "127.0.0.1" in (caught.value.hint or "")


def test_ipv6_hosts_get_ports() -> None:
    """A bare IPv6 address once reached bind() bracketed as in a URL ([::1]): a socket.gaierror."""
    for host in ("::1", "::"):
        ports, _ = choose_ports(host)
        assert busy_ports(host, ports) == []


def test_an_unresolvable_host_given_to_ftx_run_fails_before_any_server_starts(
    ftx_cli: Any, ftx_home: Path, tiny_gptj_dir: Path
) -> None:
    result = ftx_cli(
        "run", str(tiny_gptj_dir), "--runtime", "python", "--prompt", "Hi", "--max-tokens", "1", "--host", "not a host"
    )
    assert result.exit_code == 1 and result.exception is None, (result.stderr, result.exception)
    assert "error: --host 'not a host' does not resolve" in result.stderr and "hint: pass an address" in result.stderr
    assert "starting tritonserver" not in result.stderr and "Traceback" not in result.stderr
    logs = ftx_home / "triton" / "logs"
    assert not logs.exists() or not list(logs.glob("*.log"))  # no tritonserver was started


def test_an_unresolvable_openai_host_fails_before_any_server_starts(
    ftx_cli: Any, ftx_home: Path, tiny_gptj_dir: Path
) -> None:
    """The OpenAI front starts after tritonserver: its host is checked before either."""
    result = ftx_cli("run", str(tiny_gptj_dir), "--runtime", "python", "--detach", "--openai-host", "bad host")
    assert result.exit_code == 1 and result.exception is None, (result.stderr, result.exception)
    assert "error: --openai-host 'bad host' does not resolve" in result.stderr
    logs = ftx_home / "triton" / "logs"
    assert not logs.exists() or not list(logs.glob("*.log"))  # no tritonserver was started


PORT_OPTIONS = ["--http-port", "--grpc-port", "--metrics-port"]


@pytest.mark.parametrize("value", ["70000", "-5", "0"])
@pytest.mark.parametrize("option", PORT_OPTIONS)
@pytest.mark.parametrize("command", [("run", "--prompt", "Hi", "--max-tokens", "1"), ("run", "--dry-run"), ("lock",)])
def test_a_port_out_of_range_is_a_usage_error(
    ftx_cli: Any, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path, command: tuple[str, ...], option: str, value: str
) -> None:
    """Once a traceback (OverflowError from bind) or a dry run printing ``ports 70000/free``."""
    name, *rest = command
    out = ("-o", str(tmp_path / "ftx.toml")) if name == "lock" else ()
    result = ftx_cli(name, str(tiny_gptj_dir), *rest, *out, f"{option}={value}")
    assert result.exit_code == 2 and result.exception is None, (result.stderr, result.exception)
    # click names the option (and its environment twin) before the value
    assert f"'{option}'" in result.stderr and f"{value} is not in the range 1<=x<=65535" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == "" and not (tmp_path / "ftx.toml").exists()


@pytest.mark.parametrize("option", PORT_OPTIONS)
def test_a_port_out_of_range_in_the_environment_is_a_usage_error(
    ftx_cli: Any, ftx_home: Path, tiny_gptj_dir: Path, option: str
) -> None:
    env = {"FTX_RUN_" + option[2:].replace("-", "_").upper(): "-5"}
    result = ftx_cli("run", str(tiny_gptj_dir), "--prompt", "Hi", "--max-tokens", "1", env=env)
    assert result.exit_code == 2 and f"'{option}'" in result.stderr and "-5 is not in the range" in result.stderr


def _leave_time_wait_on(port: int) -> None:
    """What a server that just answered a client and stopped leaves behind: a connection of ``port`` in
    TIME_WAIT (the server side closed first) and no listener. The listener sets SO_REUSEADDR, as
    tritonserver's do."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen()
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = server.accept()
            accepted.close()  # the server closes first: its side of the connection lingers in TIME_WAIT
            client.recv(1)
    with socket.socket() as plain:  # the state that used to move a second run off Triton's ports
        with pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))


def test_a_port_left_in_time_wait_by_a_stopped_server_counts_as_free() -> None:
    port = free_ports().http
    _leave_time_wait_on(port)
    assert port_free("127.0.0.1", port)
    assert busy_ports("127.0.0.1", ServerPorts(port, port, port)) == []


@pytest.mark.skipif(find_spec("pytriton") is None, reason="nvidia-pytriton is not installed")
def test_tritonserver_serves_on_ports_left_in_time_wait(tmp_path: Path) -> None:
    """A second run right after the first keeps Triton's ports: tritonserver's listeners bind where only
    lingering connections of the last server remain (real tritonserver)."""
    ports = free_ports()
    for port in (ports.http, ports.grpc, ports.metrics):
        _leave_time_wait_on(port)
    assert busy_ports("127.0.0.1", ports) == []
    with TritonServer(
        add_repository(tmp_path / "repo"), home=tmp_path / "home", ports=ports, exit_timeout_s=5
    ) as server:
        assert server.http_url == f"127.0.0.1:{ports.http}"
        np.testing.assert_array_equal(infer_http(server.http_url, "add_one"), INPUT + 1)


def test_a_port_held_on_one_interface_is_busy_for_a_server_on_all(listening: socket.socket) -> None:
    """A server given 0.0.0.0 binds every interface: a listener on 127.0.0.1 alone keeps that port from it."""
    port = listening.getsockname()[1]
    assert not port_free("0.0.0.0", port) and not port_free("127.0.0.1", port)


def test_an_internal_port_is_never_one_the_server_already_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    """tritonserver's own ports behind the fronts are picked after its public ones, which are not bound yet, so
    the kernel may hand one out again (a CI run started tritonserver with its gRPC and metrics ports equal): a
    port in ``avoid`` is passed over."""
    from ftx_triton.server import ports

    handed = iter([48241, 48241, 50001])
    monkeypatch.setattr(ports, "_any_loopback_port", lambda: next(handed))
    assert ports.loopback_port({48241}) == 50001
