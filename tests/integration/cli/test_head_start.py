"""The head start: a second identical ``ftx run`` starts the server of the first before it has planned, and takes it
only when it is the server it would start (real ``ftx run`` processes, the real tritonserver, a tiny GPT-J)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ftx_triton.server import head_start
from ftx_triton.server.launch import LEASH_FLAG
from python_runtime_support import SERVER_MARKS, own_ports
from triton_helpers import command_lines

pytestmark = SERVER_MARKS

FTX = str(Path(sys.executable).parent / "ftx")


def _ftx(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FTX, *args], capture_output=True, text=True, timeout=600, env=env, cwd=cwd, check=False)


def _events(stderr: str, name: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(name)]


def _served_repository(env: dict[str, str], cwd: Path, name: str) -> str:
    (row,) = [r for r in json.loads(_ftx("ps", "--json", env=env, cwd=cwd).stdout) if r["name"] == name]
    assert row["alive"]
    return str(row["repository"])


def _processes_naming(text: str) -> list[str]:
    """Command lines of running processes that hold ``text`` (a repository or shared-memory prefix)."""
    found = []
    for line in command_lines():
        words = line.split()
        # not this test run itself (whose arguments may name the path); every path here is under pytest's tmp folder
        ours = bool(words) and (Path(words[0]).name == "pytest" or words[1:3] == ["-m", "pytest"])
        if text in line and not ours:
            found.append(line)
    return found


@pytest.fixture(scope="module")
def checkpoint_run(
    tmp_path_factory: pytest.TempPathFactory, built_demo: Path
) -> Iterator[tuple[list[str], dict[str, str], Path, str]]:
    """A copy of the tiny GPT-J built, then served once with ``ftx run CKPT --detach`` (all cached, so its launch is
    recorded) and stopped:
    the same run's arguments, environment, working folder and the repository it served. The tests run in order:
    the last one changes the checkpoint."""
    tmp_path = tmp_path_factory.mktemp("head-start")
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(built_demo, checkpoint)
    env = {**os.environ, "FTX_HOME": str(tmp_path / "home"), "FTX_DEVICE": "cpu"}
    argv = ["-v", "run", str(checkpoint), "--runtime", "python", "--detach", "--name", "ahead", *own_ports()]
    built = _ftx("run", str(checkpoint), "--runtime", "python", "--until", "configure", env=env, cwd=tmp_path)
    assert built.returncode == 0, built.stderr[-3000:]
    first = _ftx(*argv, env=env, cwd=tmp_path)  # every stage cached: its launch is recorded
    assert first.returncode == 0, first.stderr[-3000:]
    repository = _served_repository(env, tmp_path, "ahead")
    assert _ftx("stop", "ahead", env=env, cwd=tmp_path).returncode == 0
    assert list((tmp_path / "home" / "triton" / "head-starts").glob("*.json"))
    try:
        yield argv, env, tmp_path, repository
    finally:
        _ftx("stop", "--all", env=env, cwd=tmp_path)


def test_the_same_run_again_is_served_by_the_server_it_started_ahead(checkpoint_run) -> None:  # type: ignore[no-untyped-def]
    argv, env, cwd, repository = checkpoint_run
    again = _ftx(*argv, env=env, cwd=cwd)
    assert again.returncode == 0, again.stderr[-3000:]
    (taken,) = _events(again.stderr, "server.head_start")
    assert "taken=True" in taken, again.stderr[-3000:]
    assert _served_repository(env, cwd, "ahead") == repository
    # a CPU deployment's tritonserver (the one started ahead too) runs without GPU metrics, whose start could hold
    # it a minute after its models loaded on a machine without GPUs
    servers = [line for line in _processes_naming(repository) if "--model-repository=" in line]
    assert servers and all("--allow-gpu-metrics=false" in line for line in servers), servers
    answer = _ftx("generate", "Once upon a time", "--max-tokens", "4", env=env, cwd=cwd)
    assert answer.returncode == 0 and answer.stdout.strip(), answer.stderr[-2000:]
    assert _ftx("stop", "ahead", env=env, cwd=cwd).returncode == 0  # released when recorded: `ftx stop` finds it
    assert not _processes_naming(repository)


RUN_PROBE = """
import atexit, json, sys
sys.argv = ["ftx", *{argv!r}]
atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=sys.stderr))
from ftx_triton.entry import main
main()
"""
NOT_FOR_A_CACHED_RUN = ("numpy", "tritonclient", "grpc", "google.protobuf", "ftx_triton.repository.model_config")
"""What ftx's own process does without on a run whose model is not decoupled: its serve stage asks the server for
the model's config and its first token over HTTP (JSON), and reads numpy's version from its metadata."""


def test_a_cached_run_imports_no_numpy_grpc_or_protobuf_in_ftxs_process(checkpoint_run) -> None:  # type: ignore[no-untyped-def]
    """On a small machine ftx's CPU competes with the model's load: its serve stage imports nothing of numpy,
    tritonclient, gRPC or protobuf (0.2-0.3 CPU-s), and still checks that the server generates."""
    argv, env, cwd, _repository = checkpoint_run
    python = Path(FTX).read_text().splitlines()[0].removeprefix("#!")  # ftx's python: the request's interpreter
    done = subprocess.run(
        [python, "-c", RUN_PROBE.format(argv=argv)], capture_output=True, text=True, timeout=600, env=env, cwd=cwd
    )
    try:
        assert done.returncode == 0, done.stderr[-3000:]
        (taken,) = _events(done.stderr, "server.head_start")
        assert "taken=True" in taken, done.stderr[-3000:]
        assert "step='smoke generation'" in done.stderr and "serve.ready" in done.stderr
        loaded = set(json.loads(done.stderr.strip().splitlines()[-1]))
        assert not {m for m in loaded for n in NOT_FOR_A_CACHED_RUN if m == n or m.startswith(n + ".")}
    finally:
        assert _ftx("stop", "ahead", env=env, cwd=cwd).returncode == 0


@pytest.fixture
def as_the_run(checkpoint_run, monkeypatch):  # type: ignore[no-untyped-def]
    """This process as the recorded ``ftx run`` (its folder and interpreter; its environment as ``begin`` is called,
    pytest's own variables included); its head start forgotten afterwards."""
    argv, env, cwd, repository = checkpoint_run
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "executable", Path(FTX).read_text().splitlines()[0].removeprefix("#!"))  # ftx's python

    def begin() -> head_start.HeadStart | None:
        for key in set(os.environ) - set(env):
            monkeypatch.delenv(key)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        head_start.reset()
        head_start.begin(argv)
        return head_start.pending()

    try:
        yield begin, repository
    finally:
        head_start.reset()


def test_an_early_server_nobody_takes_is_gone_with_its_shared_memory(as_the_run) -> None:  # type: ignore[no-untyped-def]
    """In this process: the recorded request starts its server (on a leash); a launch that differs in anything is
    refused and the server stopped at once; one that ftx never takes stops when its leash ends."""
    begin, repository = as_the_run
    head = begin()
    assert head is not None and head.proc.poll() is None and LEASH_FLAG in head.proc.args
    prefix = head.launch.spec["shm_prefix"]
    changed = dataclasses.replace(head.launch, env={**head.launch.env, "FTX_EXTRA": "1"})
    assert head_start.adopt(changed) is None  # another environment: not this server
    assert head.proc.poll() is not None and not _processes_naming(prefix)
    assert not Path(head.launch.log_path).exists() and not list(Path("/dev/shm").glob(f"{prefix}*"))

    leashed = begin()
    assert leashed is not None
    prefix = leashed.launch.spec["shm_prefix"]
    leashed.proc.stdin.close()  # as when ftx dies before taking it
    leashed.proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while _processes_naming(prefix) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _processes_naming(prefix)
    assert "did not take it: stopping" in Path(leashed.launch.log_path).read_text()
    head_start.reset()
    assert _processes_naming(repository) == []


def test_a_changed_checkpoint_stops_the_early_server_and_serves_the_new_model(checkpoint_run) -> None:  # type: ignore[no-untyped-def]
    """The early server loads the last run's repository; the checkpoint changed since (same path, arguments and
    environment), so the run builds a new one: the early server must be gone, never served nor reported ready."""
    argv, env, cwd, old_repository = checkpoint_run
    weights = cwd / "ckpt" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-64:] = bytes(b ^ 0x5A for b in data[-64:])  # other weights of the same shapes
    weights.write_bytes(bytes(data))
    again = _ftx(*argv, env=env, cwd=cwd)
    assert again.returncode == 0, again.stderr[-3000:]
    (dropped,) = _events(again.stderr, "server.head_start")
    assert "taken=False" in dropped and "stage builds" in dropped, dropped
    new_repository = _served_repository(env, cwd, "ahead")
    assert new_repository != old_repository
    assert not _processes_naming(old_repository)  # the early server, on the old model, is gone
    (record,) = (cwd / "home" / "triton" / "head-starts").glob("*.json")
    assert new_repository in record.read_text()  # the run that built recorded its own server's launch
    assert _ftx("stop", "ahead", env=env, cwd=cwd).returncode == 0
    after_build = _ftx(*argv, env=env, cwd=cwd)  # the build's imports wrote to its environment; its server did
    assert after_build.returncode == 0, after_build.stderr[-3000:]  # not inherit that, so this one matches
    (taken,) = _events(after_build.stderr, "server.head_start")
    assert "taken=True" in taken, after_build.stderr[-3000:]
    assert _served_repository(env, cwd, "ahead") == new_repository
