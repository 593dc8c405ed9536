"""The OpenAI front's process started ahead (``ftx run`` starts it as the serve stage begins): it binds nothing
and writes nothing until it is handed its arguments, then serves like a fresh one; unused, dead or started for
the other mode (foreground / detached), it is ended and a fresh one serves. No tritonserver is needed: the
endpoint answers ``/health`` (503) with Triton unreachable."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from ftx_triton.errors import ServeError
from ftx_triton.openai_api.launch import WarmFront, start_openai
from ftx_triton.server.ports import free_ports, port_free


def _deployment(tmp_path: Path) -> tuple[Path, Path, str]:
    (tmp_path / "deployment" / "preprocessing" / "1").mkdir(parents=True)
    unreachable = f"http://127.0.0.1:{free_ports('127.0.0.1').http}"
    return tmp_path / "deployment", tmp_path / "home", unreachable


def _health(url: str) -> int:
    try:
        with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=5) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_warm_front_binds_nothing_until_handed_its_arguments_then_serves(tmp_path: Path) -> None:
    deployment, home, triton = _deployment(tmp_path)
    port = free_ports("127.0.0.1").http
    warm = WarmFront(detach=False)
    warm.start()
    assert warm.process is not None
    pid = warm.process.pid
    time.sleep(1.5)  # its imports are done by now
    assert warm.process.poll() is None and port_free("127.0.0.1", port)
    assert not (home / "openai").exists()
    endpoint = start_openai(triton, deployment, "warm-model", home=home, port=port, warm=warm)
    try:
        assert endpoint.process.pid == pid  # the warm process serves
        assert _health(endpoint.url) == 503  # up; Triton is not
        with urllib.request.urlopen(endpoint.url + "/models", timeout=5) as reply:
            assert [m["id"] for m in json.load(reply)["data"]] == ["warm-model"]
        assert endpoint.log_path.is_file()
    finally:
        endpoint.stop()
    warm.close()  # taken: closing it again ends nothing
    assert endpoint.process.poll() is not None


def test_an_unused_warm_front_ends_without_a_trace(tmp_path: Path) -> None:
    warm = WarmFront(detach=True)
    warm.close()  # never started: nothing to end
    assert warm.process is None
    warm.start()
    process = warm.process
    assert process is not None
    warm.close()
    assert process.returncode == 0
    assert warm.take(["--help"], tmp_path / "log", detach=True) is None  # closed: nothing to hand over


def test_a_warm_front_that_died_or_was_started_for_the_other_mode_is_replaced(tmp_path: Path) -> None:
    deployment, home, triton = _deployment(tmp_path)
    foreground = WarmFront(detach=False)
    foreground.start()
    assert foreground.process is not None
    warm_process = foreground.process
    endpoint = start_openai(triton, deployment, "m", home=home, detach=True, warm=foreground)
    try:
        assert endpoint.process.pid != warm_process.pid and _health(endpoint.url) == 503
        assert warm_process.poll() is not None  # the unusable warm process was ended
    finally:
        endpoint.stop()
    dead = WarmFront(detach=False)
    dead.start()
    assert dead.process is not None
    dead.process.kill()
    dead.process.wait()
    endpoint = start_openai(triton, deployment, "m", home=home, warm=dead)
    try:
        assert _health(endpoint.url) == 503
    finally:
        endpoint.stop()


class _Foreign:
    """Another process's endpoint on a port: answers ``/health`` 200, as another deployment's front would."""

    def __init__(self) -> None:
        import http.server
        import threading

        class Health(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_port_taken_between_the_check_and_the_bind_is_never_mistaken_for_the_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two deployments started at once both find the same port free; the one that binds second must not take
    the other's endpoint for its own (it would print, record and measure another model's URL): it tries the
    next free port and comes up there, answering as itself."""
    from ftx_triton.openai_api import launch

    deployment, home, triton = _deployment(tmp_path)
    foreign = _Foreign()
    spare = free_ports("127.0.0.1").http
    chosen = iter([foreign.port, spare])
    monkeypatch.setattr(launch, "choose_port", lambda host, port: next(chosen))
    try:
        endpoint = start_openai(triton, deployment, "raced-model", home=home)
        try:
            assert endpoint.port == spare
            assert _health(endpoint.url) == 503  # this endpoint (Triton unreachable), not the foreign 200
        finally:
            endpoint.stop()
        monkeypatch.setattr(launch, "choose_port", lambda host, port: foreign.port)
        with pytest.raises(ServeError, match="another process took it first"):
            start_openai(triton, deployment, "raced-model", home=home, port=foreign.port)
    finally:
        foreign.close()


def test_a_warm_front_makes_the_endpoints_later_imports_while_it_waits() -> None:
    """The token route's config parser and tokenizer code and the gRPC client were imported only once the warm
    process had its arguments (after the server was ready): 0.3-0.8 s of the OpenAI front's start. A fresh
    interpreter, its stdin closed, so the warm process does its imports and ends."""
    code = (
        "import sys\n"
        "from ftx_triton.openai_api.__main__ import AHEAD, warm\n"
        "before = [m for m in AHEAD if m in sys.modules]\n"
        "warm()\n"
        "print(before, [m for m in AHEAD if m not in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["[]", "[]"], out.stdout + out.stderr
