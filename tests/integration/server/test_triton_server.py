"""The local tritonserver manager, against the real tritonserver from the nvidia-pytriton wheel."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from importlib.util import find_spec
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner
from ftx_triton.cli.servers import commands
from ftx_triton.errors import ServeError
from ftx_triton.server import install as install_mod
from ftx_triton.server import process_tree
from ftx_triton.server import tritonserver as server_mod
from ftx_triton.server.install import find_tritonserver, prepare_backends, server_env
from ftx_triton.server.launch import SHM_PREFIX
from ftx_triton.server.ports import free_ports
from ftx_triton.server.records import ServerRecord, list_servers, stop_server
from ftx_triton.server.server_log import diagnose, failed_models
from ftx_triton.server.tritonserver import TritonServer
from triton_helpers import (
    FAILING_PY,
    INPUT,
    add_one_model,
    add_repository,
    infer_grpc,
    infer_http,
    process_gone,
    python_child,
    python_model,
    shm_regions,
)

needs_triton = pytest.mark.skipif(find_spec("pytriton") is None, reason="nvidia-pytriton is not installed")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def _cli() -> click.Group:
    group = click.Group("ftx")
    for command in commands:
        group.add_command(command)
    return group


def _own_shm(server: TritonServer) -> list[str]:
    return sorted(name for name in shm_regions() if name.startswith(server.shm_prefix))


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _model_ready(url: str, model: str) -> bool:
    try:
        with _DIRECT.open(f"http://{url}/v2/models/{model}/ready", timeout=5) as response:
            return response.status == 200
    except urllib.error.HTTPError:
        return False


# --------------------------------------------------------------------------- real server


@needs_triton
def test_serves_python_models_and_ensemble_over_http_and_grpc(tmp_path: Path, home: Path) -> None:
    repo = add_repository(tmp_path / "repo")
    before = shm_regions()
    messages: list[str] = []
    server = TritonServer(repo, home=home, exit_timeout_s=5)
    server.start(progress=messages.append)
    try:
        assert server.http_url.startswith("127.0.0.1:") and server.grpc_url.startswith("127.0.0.1:")
        np.testing.assert_array_equal(infer_http(server.http_url, "add_one"), INPUT + 1)
        np.testing.assert_array_equal(infer_http(server.http_url, "add_two"), INPUT + 2)
        np.testing.assert_array_equal(infer_grpc(server.grpc_url, "add_one_b"), INPUT + 1)
        np.testing.assert_array_equal(infer_grpc(server.grpc_url, "add_two"), INPUT + 2)
        assert _own_shm(server), "the stubs' shared memory should carry this server's prefix"
        with _DIRECT.open(server.metrics_url, timeout=5) as response:
            assert response.status == 200
    finally:
        server.stop()
    server.stop()  # idempotent
    assert process_gone(server.pid)
    # Every region this server made carries its prefix; other servers may run concurrently.
    assert not {name for name in shm_regions() - before if name.startswith(server.shm_prefix)}
    assert any("loading model add_one" in m for m in messages) and any("ready" in m for m in messages)
    text = server.log_path.read_text()
    header = text.splitlines()[0]
    assert "--http-address=127.0.0.1" in header and "--metrics-address=127.0.0.1" in header
    # a clean stop: no connection held tritonserver's exit (the front's idle keep-alive pool did, for
    # the whole exit timeout, after which it gave up unloading and the supervisor killed the stubs)
    assert "HTTP service connections" not in text and "Exit timeout expired" not in text
    assert "killed" not in text.split("stop requested", 1)[1]
    pyver = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert (home / "triton" / f"backends-{pyver}" / "python" / "triton_python_backend_stub").is_file()


@needs_triton
def test_model_whose_initialize_raises_fails_start_with_its_cause_once(tmp_path: Path, home: Path) -> None:
    repo = tmp_path / "repo"
    add_one_model(repo, "add_one")
    python_model(repo, "broken", FAILING_PY)
    server = TritonServer(repo, home=home, exit_timeout_s=5)
    with pytest.raises(ServeError) as info:
        server.start()
    message = str(info.value)
    assert "model 'broken' failed to load" in message
    # the log repeats the cause in several forms; the error says it once and points at the log
    assert message.count("initialize exploded on purpose") == 1, message
    assert "last lines of" not in message
    assert "broken" in (info.value.hint or "") and str(server.log_path) in (info.value.hint or "")
    assert process_gone(server.pid)
    assert not _own_shm(server)
    server.stop()  # still fine after a failed start


@needs_triton
def test_explicit_model_control_loads_only_listed_models(tmp_path: Path, home: Path) -> None:
    repo = add_repository(tmp_path / "repo", failing=True)  # "broken" is never loaded
    with TritonServer(repo, home=home, model_control="explicit", load_models=["add_one"], exit_timeout_s=5) as server:
        assert server.expected_models == ("add_one",)
        np.testing.assert_array_equal(infer_http(server.http_url, "add_one"), INPUT + 1)
        assert _model_ready(server.http_url, "add_one")
        for other in ("add_one_b", "add_two", "broken"):
            assert not _model_ready(server.http_url, other)
    assert process_gone(server.pid)


def _detachable(tmp_path: Path, home: Path) -> TritonServer:
    """A started server of one model (``add_one``), named ``tiny``, that may outlive this process."""
    repo = tmp_path / "repo"
    add_one_model(repo, "add_one")
    server = TritonServer(repo, home=home, name="tiny", die_with_parent=False, exit_timeout_s=5)
    server.start()
    return server


@needs_triton
def test_detach_list_and_stop_through_the_cli(tmp_path: Path, home: Path) -> None:
    server = _detachable(tmp_path, home)
    try:
        state = server.detach()
        assert state == home / "servers" / "tiny.json"
        [record] = list_servers(home)
        assert (record.name, record.pid, record.alive) == ("tiny", server.pid, True)
        assert record.http_url == server.http_url and record.models == ("add_one",)
        np.testing.assert_array_equal(infer_http(record.http_url, "add_one"), INPUT + 1)

        runner, env = CliRunner(), {"FTX_HOME": str(home)}
        result = runner.invoke(_cli(), ["ps"], env=env)
        assert result.exit_code == 0, result.output
        assert "tiny" in result.output and str(server.pid) in result.output and "running" in result.output
        listed = json.loads(runner.invoke(_cli(), ["ps", "--json"], env=env).output)
        assert listed[0]["grpc"] == f"grpc://{server.grpc_url}" and listed[0]["alive"] is True

        result = runner.invoke(_cli(), ["stop", "tiny"], env=env)
        assert result.exit_code == 0, result.output
        assert f"stopped tiny (pid {server.pid})" in result.output
        assert process_gone(server.pid)
        assert list_servers(home) == [] and not state.exists()
        assert not _own_shm(server)
    finally:
        server.stop()


@needs_triton
def test_a_detached_server_stopped_by_its_own_process_leaves_no_record(tmp_path: Path, home: Path) -> None:
    """A run that detached its server and then failed (its front could not be recorded) stops the server: its record
    goes with it, so `ftx ps` does not list a server that is gone (the record used to stay)."""
    server = _detachable(tmp_path, home)
    try:
        state = server.detach()
        assert state.is_file()
    finally:
        server.stop()
    assert process_gone(server.pid) and not state.exists() and list_servers(home) == []


@needs_triton
@pytest.mark.parametrize("which", ["grpc", "http"])
def test_port_in_use_is_reported_and_auto_ports_are_repicked(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch, which: str
) -> None:
    """Either front's port taken: the start fails naming it (the supervisor starts tritonserver before its fronts
    listen, so a server that was ready on the other port first would be a lie) and new auto ports serve."""
    repo = tmp_path / "empty"
    repo.mkdir()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        good = free_ports()
        blocked = dataclasses.replace(good, **{which: taken})

        server = TritonServer(repo, home=home, ports=blocked, exit_timeout_s=5)
        with pytest.raises(ServeError, match=f"port in use: 127.0.0.1:{taken}"):
            server.start()
        assert process_gone(server.pid)

        picks = iter([blocked, free_ports()])
        monkeypatch.setattr(server_mod, "free_ports", lambda host="127.0.0.1": next(picks))
        with TritonServer(repo, home=home, exit_timeout_s=5) as retried:
            assert getattr(retried.ports, which) != taken
        assert process_gone(retried.pid)


@needs_triton
def test_a_port_held_by_another_ready_server_is_never_taken_for_this_one(tmp_path: Path, home: Path) -> None:
    """Two deployments that both found a port free: the second's front cannot bind it, and until its supervisor
    says so the port answers ready, for the first server. Only an answer signed by this server's supervisor
    (the front names its pid) counts, so the start fails naming the port instead of serving another model."""
    first_repo, second_repo = tmp_path / "first", tmp_path / "second"
    first_repo.mkdir()
    second_repo.mkdir()
    with TritonServer(first_repo, home=home, exit_timeout_s=5) as first:
        ports = dataclasses.replace(free_ports(), http=first.ports.http)
        second = TritonServer(second_repo, home=home, ports=ports, exit_timeout_s=5, name="second")
        with pytest.raises(ServeError, match=f"port in use: 127.0.0.1:{first.ports.http}"):
            second.start()
        assert process_gone(second.pid)
        assert first.running


@needs_triton
def test_stub_that_cannot_start_fails_fast_instead_of_hanging(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_env = server_mod.server_env

    def env_without_vendored_libs(install, env=None):  # type: ignore[no-untyped-def]
        result = real_env(install, env)
        result["LD_LIBRARY_PATH"] = result["LD_LIBRARY_PATH"].replace(str(install.libs), str(tmp_path / "none"))
        return result

    monkeypatch.setattr(server_mod, "server_env", env_without_vendored_libs)
    repo = tmp_path / "repo"
    add_one_model(repo, "add_one")
    server = TritonServer(repo, home=home, exit_timeout_s=5)
    with pytest.raises(ServeError, match="stub cannot start: shared library libcudart") as info:
        server.start()
    assert "nvidia_pytriton.libs" in (info.value.hint or "")
    assert str(server.log_path) in (info.value.hint or "")  # the cause is said once; the log is named
    assert process_gone(server.pid)
    assert not _own_shm(server)


@needs_triton
def test_ready_timeout_stops_the_server(tmp_path: Path, home: Path) -> None:
    repo = tmp_path / "empty"
    repo.mkdir()
    server = TritonServer(repo, home=home, ready_timeout_s=0)
    with pytest.raises(ServeError, match="not ready after 0 s"):
        server.start()
    assert process_gone(server.pid)


CHILD = """
import sys
from pathlib import Path
from ftx_triton.server.tritonserver import TritonServer
server = TritonServer(Path(sys.argv[1]), home=Path(sys.argv[2]))
server.start()
print("PID", server.pid, flush=True)
sys.stdin.read()
"""


@needs_triton
def test_server_dies_with_a_killed_parent(tmp_path: Path, home: Path) -> None:
    repo = tmp_path / "empty"
    repo.mkdir()
    parent = python_child(CHILD, str(repo), str(home))
    try:
        lines = iter(parent.stdout.readline, "")  # type: ignore[union-attr]
        pid = next(int(line.split()[1]) for line in lines if line.startswith("PID "))
        parent.kill()
        parent.wait()
        for _ in range(300):  # SIGTERM from the kernel; an empty repository exits at once
            if process_gone(pid):
                break
            time.sleep(0.1)
        assert process_gone(pid)
    finally:
        parent.kill()
        parent.wait()


# --------------------------------------------------------------------------- no server needed


def test_free_ports_are_distinct() -> None:
    ports = free_ports()
    assert len({ports.http, ports.grpc, ports.metrics}) == 3


def test_missing_pytriton_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(install_mod.importlib_util, "find_spec", lambda name: None)
    with pytest.raises(ServeError) as info:
        find_tritonserver()
    assert "pip install --no-deps nvidia-pytriton" in (info.value.hint or "")  # its numpy<2 pin left out


@needs_triton
def test_backends_prepared_once_and_env(home: Path) -> None:
    install = find_tritonserver()
    first = prepare_backends(install, home)
    stamp = (first / ".ftx-stamp.json").stat().st_mtime_ns
    assert prepare_backends(install, home) == first
    assert (first / ".ftx-stamp.json").stat().st_mtime_ns == stamp
    assert (first / "python" / "triton_python_backend_stub").is_file()
    assert not list((home / "triton").glob(".backends-*"))
    env = server_env(install, {"LD_LIBRARY_PATH": "/extra"})
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)
    libs = env["LD_LIBRARY_PATH"].split(":")
    # the caller's folders first (a backend's own libraries beat same-named ones beside libpython), the wheel's last
    assert libs[0] == "/extra" and libs[-1] == str(install.libs)


def test_backends_prepared_by_two_processes_at_once_are_published_whole(home: Path) -> None:
    """Two ftx processes preparing the backends of a fresh home at once: one builds, the other waits for it (the
    build's lock) and takes it; both get the same, complete directory and nothing is left beside it."""
    code = (
        "import sys; from pathlib import Path; from ftx_triton.server.install import find_tritonserver, "
        "prepare_backends; print(prepare_backends(find_tritonserver(), Path(sys.argv[1])))"
    )
    runs = [
        subprocess.Popen([sys.executable, "-c", code, str(home)], stdout=subprocess.PIPE, text=True) for _ in range(2)
    ]
    printed = [run.communicate(timeout=120)[0].strip().splitlines() for run in runs]
    assert [run.returncode for run in runs] == [0, 0]
    target = home / "triton" / f"backends-{find_tritonserver().python_version}"
    assert [lines[-1] for lines in printed] == [str(target), str(target)]
    assert sum("server.backends_prepared" in line for lines in printed for line in lines) == 1  # built once
    assert (target / "python" / "triton_python_backend_stub").is_file() and (target / ".ftx-stamp.json").is_file()
    assert not list((home / "triton").glob(".backends-*"))


def test_invalid_options_are_rejected(tmp_path: Path, home: Path) -> None:
    with pytest.raises(ServeError, match="explicit"):
        TritonServer(tmp_path, home=home, load_models=["a"])
    with pytest.raises(ServeError, match="model control"):
        TritonServer(tmp_path, home=home, model_control="sometimes")
    with pytest.raises(ServeError, match="does not exist"):
        TritonServer(tmp_path / "nope", home=home)
    with pytest.raises(ServeError, match="die_with_parent"):
        TritonServer(tmp_path, home=home).detach()


REAL_LINES = {
    "model": (
        "E1122 00:08:19.315950 3433 model_lifecycle.cc:642] \"failed to load 'bad' version 1: Internal: "
        'RuntimeError: boom-xyz\\n\\nAt:\\n  /tmp/exp/repo/bad/1/model.py(2): initialize\\n"'
    ),
    "port": 'E1122 00:08:29.673107 3574 main.cc:245] "failed to start GRPC service: Unavailable - '
    "Socket '127.0.0.1:18001' already in use \"",
    "cudart": "/x/backends/python/triton_python_backend_stub: error while loading shared libraries: "
    "libcudart-09529672.so.12.6.77: cannot open shared object file: No such file or directory",
}


def test_diagnose_recognises_known_failures() -> None:
    assert failed_models(REAL_LINES["model"]) == {
        "bad": "Internal: RuntimeError: boom-xyz (at /tmp/exp/repo/bad/1/model.py(2): initialize)"
    }
    found = diagnose(REAL_LINES["model"])
    assert found and "model 'bad' failed to load: Internal: RuntimeError: boom-xyz" in found.cause
    found = diagnose(REAL_LINES["port"])
    assert found and found.port_in_use and "127.0.0.1:18001" in found.cause
    found = diagnose(REAL_LINES["cudart"])
    assert found and "stub cannot start" in found.cause and "nvidia_pytriton.libs" in found.hint
    found = diagnose(
        REAL_LINES["model"] + "\nAttributeError: '_thread.RLock' object has no attribute '_recursion_count'"
    )
    assert found and "LD_LIBRARY_PATH" in found.hint
    assert diagnose("I1122 all good") is None


def _fake_record(home: Path, name: str, pid: int) -> None:
    stat = process_tree.proc_stat(pid)
    record = ServerRecord(
        name=name,
        pid=pid,
        host="127.0.0.1",
        http_port=1,
        grpc_port=2,
        metrics_port=3,
        repository="/repo",
        log_path="/log",
        started_at="now",
        start_ticks=stat[1] if stat else None,
        shm_prefix=SHM_PREFIX + f"ftx-test{name}-",
        exit_timeout_s=1,
    )
    (home / "servers").mkdir(parents=True, exist_ok=True)
    (home / "servers" / f"{name}.json").write_text(record.to_json())


@pytest.mark.parametrize("start_ticks", ["missing", None, "12", 12345])
def test_a_record_whose_pid_cannot_be_verified_stops_nothing(home: Path, start_ticks: object) -> None:
    """A record without the process's start time (or a wrong one) names a pid that may be anybody's now:
    `ftx stop` once killed an unrelated process (and its group) through such a record."""
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        _fake_record(home, "old", bystander.pid)
        path = home / "servers" / "old.json"
        data = json.loads(path.read_text())
        if start_ticks == "missing":
            del data["start_ticks"]
        else:
            data["start_ticks"] = start_ticks
        path.write_text(json.dumps(data))
        assert [r.alive for r in list_servers(home)] == [False]
        handled = stop_server(home, "old")
        assert [r.alive for r in handled] == [False] and not path.exists()
        time.sleep(0.2)
        assert bystander.poll() is None, "the unrelated process was signalled"
    finally:
        bystander.kill()
        bystander.wait()


def test_stop_server_choices_and_stale_records(home: Path) -> None:
    sleepers = [subprocess.Popen(["sleep", "60"], start_new_session=True) for _ in range(2)]
    try:
        for index, proc in enumerate(sleepers):
            _fake_record(home, f"s{index}", proc.pid)
        dead = subprocess.Popen(["true"], start_new_session=True)
        dead.wait()
        _fake_record(home, "gone", dead.pid)

        assert {r.name: r.alive for r in list_servers(home)} == {"gone": False, "s0": True, "s1": True}
        with pytest.raises(ServeError, match="2 servers are running") as info:
            stop_server(home)
        assert "--all" in (info.value.hint or "")
        with pytest.raises(ServeError, match="no server named 'nope'"):
            stop_server(home, "nope")

        runner, env = CliRunner(), {"FTX_HOME": str(home)}
        result = runner.invoke(_cli(), ["stop"], env=env)
        assert result.exit_code == 1 and "error: 2 servers are running" in result.output
        assert "hint:" in result.output

        result = runner.invoke(_cli(), ["stop", "s0"], env=env)
        assert result.exit_code == 0 and "stopped s0" in result.output
        sleepers[0].wait(timeout=10)
        handled = stop_server(home)  # the only live one, plus the stale record
        assert {(r.name, r.alive) for r in handled} == {("s1", True), ("gone", False)}
        sleepers[1].wait(timeout=10)
        assert list_servers(home) == []
        assert runner.invoke(_cli(), ["ps"], env=env).output.strip() == "no tritonserver is running"
    finally:
        for proc in sleepers:
            proc.kill()
            proc.wait()
