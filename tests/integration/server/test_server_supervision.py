"""Server faults (#14.4, #14.6, #14.8) against the real tritonserver: a body that would crash it,
a dead stub, ftx killed or stopped mid-start, orphans, homes with spaces or shell syntax, a stub
that never starts. Small Python-backend models (``triton_helpers``) keep each start to seconds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from importlib.util import find_spec
from pathlib import Path

import pytest
from click.testing import CliRunner
from ftx_triton.errors import ServeError
from ftx_triton.server import tritonserver as server_mod
from ftx_triton.server.install import find_tritonserver, prepare_backends
from ftx_triton.server.process_tree import FTX_SHM_PREFIX, SHM_DIR, STUB_NAME, stub_processes, sweep_orphans
from ftx_triton.server.records import list_servers
from ftx_triton.server.supervisor import HOME_GONE, STUB_DIED
from ftx_triton.server.tritonserver import TritonServer
from triton_helpers import (
    add_one_model,
    add_repository,
    infer_http,
    process_gone,
    python_child,
    python_model,
    shm_regions,
)

pytestmark = pytest.mark.skipif(find_spec("pytriton") is None, reason="nvidia-pytriton is not installed")

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))

SLOW_PY = """
import time


class TritonPythonModel:
    def initialize(self, args):
        time.sleep({seconds})
        {then}

    def execute(self, requests):
        return []
"""


def _post(url: str, body: bytes) -> tuple[int, str]:
    request = urllib.request.Request(f"http://{url}/v2/models/add_one/infer", data=body, method="POST")
    try:
        with _DIRECT.open(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _nested(depth: int) -> bytes:
    return (
        '{"inputs":[{"name":"input_ids","shape":[1,1],"datatype":"INT32","data":' + "[" * depth + "]" * depth + "}]}"
    ).encode()


def _own_shm(prefix: str) -> list[str]:
    return sorted(name for name in shm_regions() if name.startswith(prefix))


def _eventually(check, timeout_s: float = 20.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return bool(check())


# --------------------------------------------------------------------------- the HTTP front (#14.4)


def test_a_body_that_crashes_tritonserver_is_refused_by_the_front(tmp_path: Path) -> None:
    """A 4 MB body of nested brackets kills tritonserver 2.51 (SIGSEGV in its JSON parser): shown
    first without the front (the death is reported with its cause), then refused by the front."""
    repo = add_repository(tmp_path / "repo")
    body = _nested(2_000_000)
    assert len(body) > 4_000_000
    bare = TritonServer(
        repo, home=tmp_path / "home", http_front=False, model_control="explicit", load_models=["add_one"]
    )
    with bare:
        with pytest.raises(OSError):  # the connection dies with the server
            _post(bare.http_url, body)
        assert bare.wait(timeout=30) == 128 + signal.SIGSEGV  # the supervisor passes the crash on
        report = bare.exit_report()
        assert "SIGSEGV" in report and "exited by itself" in report
    assert process_gone(bare.pid) and not _own_shm(bare.shm_prefix)

    with TritonServer(
        repo, home=tmp_path / "home", model_control="explicit", load_models=["add_one"], max_body_bytes=8 * 1024 * 1024
    ) as server:
        status, text = _post(server.http_url, body)
        assert status == 400 and "nested deeper" in text
        status, text = _post(server.http_url, b"[" * 9_000_000)
        assert status == 413 and "at most 8388608" in text
        assert server.running
        assert infer_http(server.http_url, "add_one").tolist() == [[2, 3, 4], [5, 6, 7]]  # still serving


# --------------------------------------------------------------------------- a dead stub (#14.6)


def test_a_killed_stub_stops_the_server_and_says_which(tmp_path: Path) -> None:
    """A killed stub leaves its model 'ready' while every request fails: the supervisor stops the
    server, the report names the instance and the signal, and nothing is left behind."""
    repo = add_repository(tmp_path / "repo")
    server = TritonServer(repo, home=tmp_path / "home")
    with server:
        stubs = {Path(p.cmdline()[1]).parts[-3]: p for p in stub_processes(server.pid)}
        assert set(stubs) == {"add_one", "add_one_b"}
        time.sleep(1.5)  # the supervisor looks every 0.5 s: let it see the stub alive, to name it
        stubs["add_one_b"].kill()
        assert server.wait(timeout=30) == STUB_DIED
        report = server.exit_report()
        assert "add_one_b_0_0" in report and "SIGKILL" in report
    assert process_gone(server.pid) and not _own_shm(server.shm_prefix)


def test_ftx_ps_reports_a_detached_server_whose_stub_died_as_dead(tmp_path: Path) -> None:
    import click
    from ftx_triton.cli.servers import commands

    home = tmp_path / "home"
    repo = add_repository(tmp_path / "repo")
    server = TritonServer(repo, home=home, name="stubby", die_with_parent=False)
    server.start()
    try:
        server.detach()
        next(p for p in stub_processes(server.pid) if "/add_one/" in p.cmdline()[1]).kill()
        assert _eventually(lambda: not list_servers(home)[0].alive)
        group = click.Group("ftx")
        for command in commands:
            group.add_command(command)
        result = CliRunner().invoke(group, ["ps"], env={"FTX_HOME": str(home)})
        assert result.exit_code == 0 and "stubby" in result.output and "dead" in result.output
    finally:
        server.stop()
    assert process_gone(server.pid)


BUSY_PY = """
import time
from pathlib import Path


class TritonPythonModel:
    def execute(self, requests):
        Path(__file__).parents[1].joinpath("executing").touch()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # a long generation: the stub does not look up for 2 minutes
            sum(range(10000))
        return []
"""


def _post_busy(url: str) -> None:
    import contextlib

    with contextlib.suppress(Exception):  # the server dies under it
        infer_http(url, "busy")


def test_ftx_stop_ends_what_a_sigkilled_supervisor_left_running(tmp_path: Path) -> None:
    """Issue 27: SIGKILL of a detached server's supervisor left tritonserver and the model's stubs running;
    `ftx stop` then only removed the record. It now ends every process of that server (found by its
    random shared-memory prefix, which each of them carries) and frees its shared memory."""
    import threading

    from ftx_triton.server.process_tree import processes_of
    from ftx_triton.server.records import stop_server

    home = tmp_path / "home"
    repo = tmp_path / "repo"
    python_model(repo, "busy", BUSY_PY)
    server = TritonServer(repo, home=home, name="orphaned", die_with_parent=False)
    server.start()
    prefix, supervisor = server.shm_prefix, server.pid
    try:
        server.detach()
        assert supervisor is not None and len(processes_of(prefix)) >= 2  # supervisor, tritonserver, stubs
        threading.Thread(target=lambda: _post_busy(server.http_url), daemon=True).start()
        assert _eventually(lambda: (tmp_path / "repo" / "busy" / "executing").exists())  # the model is busy
        os.kill(supervisor, signal.SIGKILL)
        server._proc.wait(timeout=10)  # type: ignore[union-attr]  # reap it: this test started it
        left = processes_of(prefix)
        assert left, "nothing survived the supervisor's SIGKILL: the case this test is about did not happen"
        assert not list_servers(home)[0].alive
        stopped = stop_server(home, "orphaned")
        assert [r.name for r in stopped] == ["orphaned"]
        assert processes_of(prefix) == []  # ended by the stop itself, not left to die (or not) later
        assert _own_shm(prefix) == [] and list_servers(home) == []
    finally:
        for process in processes_of(prefix):
            process.kill()


# --------------------------------------------------------------------------- ftx killed mid-start (#14.6)

STARTER = """
import sys
from pathlib import Path
from ftx_triton.server.tritonserver import TritonServer
server = TritonServer(Path(sys.argv[1]), home=Path(sys.argv[2]), ready_timeout_s=120)
def progress(message):
    print(message, "| PID", server.pid, "PREFIX", server.shm_prefix, flush=True)
server.start(progress=progress)
print("STARTED", flush=True)
sys.stdin.read()
"""


def _start_in_child(repo: Path, home: Path) -> subprocess.Popen[str]:
    return python_child(STARTER, str(repo), str(home))


def _wait_for(child: subprocess.Popen[str], text: str) -> tuple[int, str]:
    for line in iter(child.stdout.readline, ""):  # type: ignore[union-attr]
        if text in line:
            parts = line.split()
            return int(parts[parts.index("PID") + 1]), parts[parts.index("PREFIX") + 1]
    raise AssertionError(f"the child never printed {text!r}")


@pytest.mark.parametrize("moment", ["spawned", "loading"])
def test_killing_ftx_during_startup_leaves_no_stub_or_shared_memory(tmp_path: Path, moment: str) -> None:
    """SIGKILL of ftx while models load (a stub mid-initialize, holding its shared memory)."""
    repo = tmp_path / "repo"
    python_model(repo, "slow", SLOW_PY.format(seconds=30, then="pass"))
    add_one_model(repo, "add_one")
    for attempt in range(3):
        child = _start_in_child(repo, tmp_path / "home")
        try:
            pid, prefix = _wait_for(child, "starting tritonserver" if moment == "spawned" else "loading model slow")
            if moment == "loading":
                assert _eventually(lambda pid=pid: len(stub_processes(pid)) == 2, 30), "the stubs never started"
            child.kill()
            child.wait()
            assert _eventually(lambda pid=pid: process_gone(pid), 30), (moment, attempt)
            assert _eventually(lambda prefix=prefix: not _own_shm(prefix), 10), (moment, attempt, _own_shm(prefix))
            assert not [p for p in _stub_orphans() if prefix in " ".join(p)], (moment, attempt)
        finally:
            child.kill()
            child.wait()


def _stub_orphans() -> list[list[str]]:
    import psutil

    found = []
    for process in psutil.process_iter(["cmdline", "ppid"]):
        args = process.info["cmdline"] or []
        if args and Path(args[0]).name == STUB_NAME and process.info["ppid"] == 1:
            found.append(args)
    return found


def test_sigterm_during_a_failing_start_leaks_no_shared_memory(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    python_model(repo, "doomed", SLOW_PY.format(seconds=3, then="raise RuntimeError('init failed on purpose')"))
    add_one_model(repo, "add_one")
    child = _start_in_child(repo, tmp_path / "home")
    try:
        pid, prefix = _wait_for(child, "loading model doomed")
        assert _eventually(lambda: _own_shm(prefix), 30), "no shared memory to leak"
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=60)
        assert _eventually(lambda: process_gone(pid), 30)
        assert _eventually(lambda: not _own_shm(prefix), 10), _own_shm(prefix)
    finally:
        child.kill()
        child.wait()


def test_orphaned_stubs_and_stale_shared_memory_are_swept_at_the_next_start(tmp_path: Path) -> None:
    """What a server killed past all supervision leaves (a stand-in process named like a stub whose
    tritonserver pid is dead, a region no process uses) is removed when the next server starts."""
    stale = SHM_DIR / f"{FTX_SHM_PREFIX}0123456789ab-stale"
    stale.write_bytes(b"x")
    dead_pid = subprocess.Popen(["true"])
    dead_pid.wait()
    script = (
        f'exec -a /x/{STUB_NAME} "$0" -c "import time; time.sleep(120)" '
        f"{FTX_SHM_PREFIX}0123456789ab-region 1048576 {dead_pid.pid} /x 336 m_0_0 DEFAULT"
    )
    orphan = subprocess.Popen(["bash", "-c", script, sys.executable], start_new_session=True)
    try:
        # Wait for the exec itself: before it, the pid is a bash whose own command line names the region,
        # which the sweep rightly counts as a live user of it. A server that a neighbouring test starts meanwhile
        # sweeps too and may get there first (then the stand-in is gone already): either way it must end up gone.
        def execed_or_swept() -> bool:
            return Path((_args(orphan.pid) or [""])[0]).name == STUB_NAME or orphan.poll() is not None

        assert _eventually(execed_or_swept, 5)
        orphan_there, stale_there = orphan.poll() is None, stale.exists()
        swept = sweep_orphans()
        assert stale.name in swept or not stale_there, swept
        assert f"stub pid {orphan.pid}" in swept or not orphan_there, swept
        assert _eventually(lambda: orphan.poll() is not None, 10)  # killed
        assert not stale.exists()
    finally:
        orphan.kill()
        stale.unlink(missing_ok=True)


def _args(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


# --------------------------------------------------------------------------- paths the stub launcher splits (#14.8)


def test_a_home_with_a_space_and_shell_syntax_serves_and_runs_nothing(tmp_path: Path) -> None:
    """The Python backend starts stubs through `bash -c`: a space made it hang, `$(…)` ran. Such
    paths reach tritonserver as links of plain characters."""
    marker = tmp_path / "MARK"
    odd = tmp_path / f"my home $(touch {marker}) `touch {marker}`"
    repo = add_repository(odd / "repo")
    with TritonServer(repo, home=odd / "home", ready_timeout_s=60) as server:
        assert infer_http(server.http_url, "add_one").tolist() == [[2, 3, 4], [5, 6, 7]]
        spec = json.loads([arg for arg in _args(server.pid) if arg][-1])
        assert all(server_mod._SAFE_PATH.fullmatch(arg.split("=", 1)[-1]) for arg in spec["command"][1:3])
    assert not marker.exists()
    assert not list(Path(server.log_path.parent).glob("MARK"))


def test_a_stub_that_cannot_be_launched_fails_at_once_with_the_reason(tmp_path: Path) -> None:
    home = tmp_path / "home"
    backends = prepare_backends(find_tritonserver(), home)
    (backends / "python" / STUB_NAME).write_text("#!/nonexistent/interpreter\n")  # bash: … cannot execute
    repo = tmp_path / "repo"
    add_one_model(repo, "add_one")
    started = time.monotonic()
    with pytest.raises(ServeError, match="stub could not be launched: bash: .*cannot execute") as info:
        TritonServer(repo, home=home, exit_timeout_s=5).start()
    assert time.monotonic() - started < 60
    assert "bash -c" in (info.value.hint or "")


def test_a_stub_that_never_connects_times_out_with_the_reason(tmp_path: Path) -> None:
    home = tmp_path / "home"
    backends = prepare_backends(find_tritonserver(), home)
    stub = backends / "python" / STUB_NAME
    stub.write_text("#!/bin/sh\nexec sleep 600\n")  # starts, never connects
    stub.chmod(0o755)
    repo = tmp_path / "repo"
    add_one_model(repo, "add_one")
    server = TritonServer(repo, home=home, exit_timeout_s=5, stub_start_timeout_s=3, ready_timeout_s=600)
    started = time.monotonic()
    with pytest.raises(ServeError, match="no Python-backend stub started for add_one within 3 s"):
        server.start()
    assert time.monotonic() - started < 60
    assert process_gone(server.pid)


def test_a_server_and_its_endpoint_whose_ftx_home_is_deleted_stop_themselves(tmp_path: Path) -> None:
    """Issue 33: after ``rm -rf $FTX_HOME`` a detached server (and its OpenAI endpoint) kept running and
    no ``ftx stop`` could find it, its record gone. Both watch the home they started from and stop: the
    server's processes end, its shared memory is removed, its ports are free again."""
    import shutil

    from ftx_triton.openai_api.launch import start_openai
    from ftx_triton.server.ports import port_free

    home = tmp_path / "home"
    repo = add_repository(tmp_path / "repo")
    (tmp_path / "deployment" / "preprocessing" / "1").mkdir(parents=True)
    server = TritonServer(repo, home=home, name="homeless", die_with_parent=False)
    server.start()
    endpoint = None
    try:
        server.detach()
        endpoint = start_openai(
            f"http://{server.http_url}", tmp_path / "deployment", "homeless", home=home, detach=True
        )
        prefix = server.shm_prefix
        assert any(name.startswith(prefix) for name in shm_regions())
        time.sleep(1.5)  # both have looked at the home at least once
        assert server.running and endpoint.process.poll() is None
        shutil.rmtree(home)
        assert _eventually(lambda: process_gone(server.pid), timeout_s=30), "the server kept running"
        assert server.wait(timeout=5) == HOME_GONE and "FTX_HOME" in server.exit_report()
        assert _eventually(lambda: endpoint.process.poll() is not None, timeout_s=30), "the endpoint kept running"
        assert not any(name.startswith(prefix) for name in shm_regions())
        assert port_free(server.host, server.ports.http) and port_free(server.host, server.ports.grpc)
    finally:
        if endpoint is not None:
            endpoint.stop()
        server.stop()
