"""A model's stub in a session of its own (``server/stub_launcher.py``), against the real tritonserver from the
nvidia-pytriton wheel: where the stubs run, that they serve, and that a stopped server leaves none of them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import psutil
import pytest
from ftx_triton.server import stub_launcher
from ftx_triton.server.head_start import HeadStart, identities
from ftx_triton.server.install import find_tritonserver, prepare_backends
from ftx_triton.server.process_tree import STUB_NAME, processes_of, stub_processes
from ftx_triton.server.tritonserver import TritonServer
from triton_helpers import INPUT, add_repository, infer_http

pytestmark = pytest.mark.skipif(find_spec("pytriton") is None, reason="nvidia-pytriton is not installed")

OWN = {stub_launcher.OWN_SESSION_ENV: "add_one"}
"""The server's environment: ``add_one``'s stub in a session of its own, ``add_one_b``'s in the server's."""


def _stubs_by_model(server: TritonServer) -> dict[str, psutil.Process]:
    """The server's stubs by model name (the model directory of their ``model.py``, their first argument)."""
    return {Path(stub.cmdline()[1]).parts[-3]: stub for stub in stub_processes(server.pid)}


def test_the_named_models_stub_runs_in_a_session_of_its_own_and_serves(tmp_path: Path) -> None:
    repo = add_repository(tmp_path / "repo")
    with TritonServer(repo, home=tmp_path / "home", exit_timeout_s=5, env=OWN) as server:
        stubs = _stubs_by_model(server)
        own, shared = stubs["add_one"], stubs["add_one_b"]
        (triton,) = [p for p in psutil.Process(server.pid).children() if p.name() == "tritonserver"]
        assert os.getsid(own.pid) == own.pid != os.getsid(server.pid)  # a session of its own
        assert os.getsid(shared.pid) == os.getsid(server.pid)  # the model not named: the server's, as ever
        assert own.ppid() == shared.ppid() == triton.pid  # tritonserver's child, watched by it as ever
        assert Path(own.cmdline()[0]).name == STUB_NAME  # process_tree.is_stub names it
        assert Path(f"/proc/{own.pid}/comm").read_text().strip() == STUB_NAME[:15]  # so does the supervisor a zombie
        np.testing.assert_array_equal(infer_http(server.http_url, "add_two"), INPUT + 2)  # through both stubs
        prefix = server.shm_prefix
    assert processes_of(prefix) == []


def test_a_server_whose_supervisor_was_killed_stops_with_its_stub_outside_the_group(tmp_path: Path) -> None:
    """The supervisor killed, the server's stop kills its process group, which the stub in a session of its own is
    not in: it is killed by the server's shared-memory prefix. The stub is stopped (SIGSTOP) first, as one busy in
    its model's code that does not get to its own check that tritonserver is alive."""
    repo = add_repository(tmp_path / "repo")
    server = TritonServer(repo, home=tmp_path / "home", exit_timeout_s=5, env=OWN)
    server.start()
    own = _stubs_by_model(server)["add_one"]
    try:
        own.suspend()
        os.kill(server.pid, signal.SIGKILL)
        server.stop()
        assert processes_of(server.shm_prefix) == []
    finally:
        server.stop()
        with contextlib.suppress(psutil.Error):
            own.kill()  # where the stop left it (the test failed)


def test_a_server_started_ahead_and_dropped_leaves_no_stub_outside_its_group(tmp_path: Path) -> None:
    """A head start that is not taken is killed, its process group at once: its stub in a session of its own too
    (stopped first, as above; one still importing torch is in the same place)."""
    repo = add_repository(tmp_path / "repo")
    with TritonServer(repo, home=tmp_path / "home", exit_timeout_s=5, env=OWN) as server:
        launch = server._launch
    assert launch is not None
    proc, offset = launch.spawn(leash=True)  # the same server again, as head_start.begin spawns it
    head = HeadStart(launch, proc, offset, "127.0.0.1", (0, 0, 0), identities(launch), time.monotonic())
    own = None
    try:
        deadline = time.monotonic() + 60
        while own is None and time.monotonic() < deadline:
            own = next((p for p in stub_processes(proc.pid) if os.getsid(p.pid) == p.pid), None)
            time.sleep(0.05)
        assert own is not None, "no stub in a session of its own"
        own.suspend()
        head.stop()
        assert processes_of(str(launch.spec["shm_prefix"])) == []
    finally:
        head.stop()
        with contextlib.suppress(psutil.Error):
            if own is not None:
                own.kill()


def test_backends_prepared_by_an_ftx_without_the_launcher_are_installed_again(tmp_path: Path) -> None:
    """A home whose backends an earlier ftx prepared (the stub itself in the launcher's place, a stamp that names no
    launcher) gets the launcher: the stamp differs, so the directory is published again."""
    install = find_tritonserver()
    home = tmp_path / "home"
    backends = prepare_backends(install, home)
    launcher = backends / "python" / STUB_NAME
    assert launcher.read_text().startswith("#!/bin/sh") and os.access(launcher, os.X_OK)
    assert (backends / "python" / stub_launcher.REAL_DIR / STUB_NAME).read_bytes() == install.stub.read_bytes()
    stamp = json.loads((backends / ".ftx-stamp.json").read_text())
    del stamp["launcher"]
    (backends / ".ftx-stamp.json").write_text(json.dumps(stamp, sort_keys=True))
    launcher.write_bytes(install.stub.read_bytes())
    again = prepare_backends(install, home)
    assert again == backends and (again / "python" / STUB_NAME).read_text() == stub_launcher.LAUNCHER
