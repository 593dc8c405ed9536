"""ftx's launcher of the Python-backend stub (``server/stub_launcher.py``), run as tritonserver runs it (``bash -c
"exec <program> <model.py> …"`` in a forked child), in front of a stand-in for tritonserver's stub program that
prints where it runs (the real stub needs a tritonserver to talk to: ``tests/integration/server/test_stub_sessions.py``
runs it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ftx_triton.server import stub_launcher
from ftx_triton.server.process_tree import STUB_NAME

STAND_IN = f"""#!{sys.executable}
import json, os, sys
print(json.dumps({{"pid": os.getpid(), "sid": os.getsid(0), "pgid": os.getpgid(0), "argv": sys.argv}}))
sys.exit(1 if len(sys.argv) == 1 else 0)
"""
"""A stand-in for tritonserver's stub program: it prints its pid, session, group and arguments and, like the real
one, exits with status 1 when it has no arguments."""


@pytest.fixture
def launcher(tmp_path: Path) -> Path:
    stand_in = tmp_path / "stand-in"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    backend = tmp_path / "backends" / "python"
    backend.mkdir(parents=True)
    stub_launcher.install(backend, stand_in)
    return backend / STUB_NAME


def _launch(
    program: Path, *args: str, own: str | None, new_session: bool = False, path: str | None = None
) -> tuple[subprocess.Popen[str], dict[str, object], int]:
    """Run ``program ARGS`` as tritonserver does; what the stand-in printed and its exit status."""
    env = {k: v for k, v in os.environ.items() if k != stub_launcher.OWN_SESSION_ENV}
    if own is not None:
        env[stub_launcher.OWN_SESSION_ENV] = own
    if path is not None:
        env["PATH"] = path
    line = " ".join(["exec", str(program), *(f"'{arg}'" for arg in args)])
    proc = subprocess.Popen(
        ["/bin/bash", "-c", line], stdout=subprocess.PIPE, text=True, env=env, start_new_session=new_session
    )
    out, _ = proc.communicate(timeout=30)
    return proc, json.loads(out), proc.returncode


def _stub_args(tmp_path: Path, model: str) -> list[str]:
    """The arguments tritonserver gives a stub: the model's ``model.py`` first, then its shared memory and more."""
    return [str(tmp_path / "repo" / model / "1" / "model.py"), "ftx-shm-0123456789ab-region", "1048576", "1048576"]


def test_the_named_models_stub_runs_in_a_session_of_its_own_as_the_same_process(launcher: Path, tmp_path: Path) -> None:
    args = _stub_args(tmp_path, "fastertransformer")
    proc, seen, code = _launch(launcher, *args, own="preprocessing fastertransformer")
    assert code == 0
    assert seen["pid"] == proc.pid  # tritonserver watches the pid it forked: the launcher and setsid exec the stub
    assert seen["sid"] == proc.pid and seen["pgid"] == proc.pid  # a session (and group) of its own
    argv = seen["argv"]
    assert isinstance(argv, list) and Path(argv[0]).name == STUB_NAME and argv[1:] == args  # is_stub names it


def test_other_models_stubs_stay_in_the_servers_session(launcher: Path, tmp_path: Path) -> None:
    for own in (None, "", "fastertransformer", "postprocessing"):
        proc, seen, code = _launch(launcher, *_stub_args(tmp_path, "preprocessing"), own=own)
        assert code == 0 and seen["pid"] == proc.pid
        assert seen["sid"] == os.getsid(0), own


def test_without_arguments_it_is_the_stub_as_tritonservers_check_runs_it(launcher: Path) -> None:
    """tritonserver runs the program once without arguments and expects the stub's status 1 (any other, it makes the
    file owner-execute only, which ``sh`` cannot read)."""
    proc, seen, code = _launch(launcher, own="fastertransformer")
    assert code == 1 and seen["argv"] == [str(launcher.parent / stub_launcher.REAL_DIR / STUB_NAME)]


def test_a_process_group_leader_runs_the_stub_as_it_is(launcher: Path, tmp_path: Path) -> None:
    """setsid(1) forks a group leader (the stub would no longer be the process tritonserver forked): the launcher
    leaves one in its session."""
    proc, seen, code = _launch(
        launcher, *_stub_args(tmp_path, "fastertransformer"), own="fastertransformer", new_session=True
    )
    assert code == 0 and seen["pid"] == proc.pid and seen["sid"] == proc.pid


def test_without_setsid_the_stub_runs_in_the_servers_session(launcher: Path, tmp_path: Path) -> None:
    proc, seen, code = _launch(
        launcher, *_stub_args(tmp_path, "fastertransformer"), own="fastertransformer", path=str(tmp_path / "empty")
    )
    assert code == 0 and seen["pid"] == proc.pid and seen["sid"] == os.getsid(0)
