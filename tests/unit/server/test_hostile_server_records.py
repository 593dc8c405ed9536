"""Damaged records of detached servers (``<home>/servers``) and OpenAI fronts (``<home>/openai``): ftx's
own files, trusted, so a record that cannot be read back is dropped rather than validated field by field.
`ftx ps` and `ftx stop` warn about it in one line, never signal the pid it names, never crash, and
`ftx stop NAME` / `ftx stop --all` remove it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from ftx_triton.server import process_tree
from ftx_triton.server.launch import FTX_SHM_PREFIX, SHM_PREFIX
from ftx_triton.server.process_tree import proc_stat


@dataclass
class Bystander:
    """A live process that a malformed record names: it must survive every command."""

    process: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def ticks(self) -> int:
        stat = proc_stat(self.pid)
        assert stat is not None
        return stat[1]

    def assert_alive(self) -> None:
        time.sleep(0.2)
        assert self.process.poll() is None, "a process named by a malformed record was signalled"


@pytest.fixture
def bystander() -> Iterator[Bystander]:
    # "ftx_triton.openai_api" in its command line: an OpenAI front's stop would take it for its own
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "ftx_triton.openai_api"], start_new_session=True
    )
    try:
        yield Bystander(process)
    finally:
        process.kill()
        process.wait()


def _server(b: Bystander, **changes: Any) -> dict[str, Any]:
    """A well-formed record of a live server (the bystander, start time included), then ``changes``."""
    record = {
        "name": "bad",
        "pid": b.pid,
        "start_ticks": b.ticks,
        "host": "127.0.0.1",
        "http_port": 1,
        "grpc_port": 2,
        "metrics_port": 3,
        "repository": "/repo",
        "log_path": "/log",
        "started_at": "2026-01-01T00:00:00+00:00",
        "models": ["ensemble"],
        "exit_timeout_s": 1,
        "shm_prefix": SHM_PREFIX + "ftx-hostile-",
    }
    return {**record, **changes}


# case: (directory, the file's text around the bystander, the problem the warning names)
CASES: dict[str, tuple[str, Callable[[Bystander], str], str]] = {
    "array": ("servers", lambda b: json.dumps([b.pid]), "not a JSON object but an array"),
    "string": ("servers", lambda b: json.dumps("bad"), "not a JSON object but a string"),
    "null": ("servers", lambda b: "null", "not a JSON object but null"),
    "number": ("servers", lambda b: str(b.pid), "not a JSON object but a number"),
    "not-json": ("servers", lambda b: "{not json", "not JSON"),
    "truncated": ("servers", lambda b: json.dumps(_server(b))[:60], "not JSON"),
    "fields-missing": ("servers", lambda b: json.dumps({"name": "bad", "pid": b.pid}), "not a server record"),
    "openai-pid-only": ("openai", lambda b: json.dumps({"pid": b.pid}), "no field 'name'"),
    "openai-array": ("openai", lambda b: json.dumps([b.pid]), "not a JSON object but an array"),
}


def _write(home: Path, case: str, b: Bystander) -> Path:
    directory, text, _ = CASES[case]
    path = home / directory / "bad.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text(b))
    return path


def _assert_warned(stderr: str, path: Path, case: str) -> None:
    lines = [line for line in stderr.splitlines() if str(path) in line]
    assert len(lines) == 1, f"expected one warning line naming {path}:\n{stderr}"
    assert lines[0].startswith("warning: ") and "record_malformed" in lines[0]
    assert CASES[case][2] in lines[0] and "ftx stop bad" in lines[0]


def _assert_clean(result: Any) -> None:
    assert result.exception is None, f"traceback: {result.exception!r}"
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("as_json", [False, True])
def test_ps_warns_about_a_malformed_record(
    ftx_cli, ftx_home: Path, bystander: Bystander, case: str, as_json: bool
) -> None:
    path = _write(ftx_home, case, bystander)
    result = ftx_cli("ps", *(["--json"] if as_json else []))
    _assert_clean(result)
    assert result.exit_code == 0, result.stderr
    _assert_warned(result.stderr, path, case)
    if as_json:
        assert json.loads(result.stdout) == []
    assert path.exists(), "ps must not remove records"
    bystander.assert_alive()


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("how", [["stop", "bad"], ["stop", "--all"]])
def test_stop_removes_a_malformed_record_without_signalling(
    ftx_cli, ftx_home: Path, bystander: Bystander, case: str, how: list[str]
) -> None:
    path = _write(ftx_home, case, bystander)
    result = ftx_cli(*how)
    bystander.assert_alive()
    _assert_clean(result)
    assert result.exit_code == 0, result.stderr
    assert f"removed malformed record {path}" in result.stdout and CASES[case][2] in result.stdout
    assert not path.exists()
    again = ftx_cli("ps")
    assert again.exit_code == 0 and str(path) not in again.stderr


@pytest.mark.parametrize("case", list(CASES))
def test_bare_stop_warns_and_keeps_a_malformed_record(ftx_cli, ftx_home: Path, bystander: Bystander, case: str) -> None:
    path = _write(ftx_home, case, bystander)
    result = ftx_cli("stop")
    _assert_clean(result)
    assert result.exit_code == 0, result.stderr
    assert "no detached servers" in result.stdout
    _assert_warned(result.stderr, path, case)
    assert path.exists()
    bystander.assert_alive()
    other = ftx_cli("stop", "other")  # a name that no record has is still an error
    _assert_clean(other)
    assert other.exit_code == 1 and "no server named 'other'" in other.stderr and path.exists()


def test_stop_all_handles_valid_records_beside_malformed_ones(ftx_cli, ftx_home: Path, bystander: Bystander) -> None:
    """A malformed record does not keep `ftx stop --all` from the others (here a dead server's record)."""
    _write(ftx_home, "truncated", bystander)
    (ftx_home / "servers" / "gone.json").write_text(json.dumps(_server(bystander, name="gone", pid=PID_DEAD)))
    ps = ftx_cli("ps")
    _assert_clean(ps)
    assert ps.exit_code == 0 and "gone" in ps.stdout and "dead" in ps.stdout
    result = ftx_cli("stop", "--all")
    _assert_clean(result)
    assert result.exit_code == 0, result.stderr
    assert "removed record of gone" in result.stdout and "removed malformed record" in result.stdout
    assert list((ftx_home / "servers").glob("*.json")) == []
    bystander.assert_alive()


PID_DEAD = 2**22 + 1
"""Above Linux's largest pid_max: a well-formed pid that no process has."""


@pytest.mark.parametrize("prefix", [FTX_SHM_PREFIX, SHM_PREFIX + "ftx", SHM_PREFIX])
def test_stop_of_a_record_naming_a_common_shm_prefix_removes_no_other_servers_memory(
    ftx_cli, ftx_home: Path, bystander: Bystander, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefix: str
) -> None:
    """A dead server's record whose shared-memory prefix is the start every ftx server's regions share (a damaged
    record) removes the record, not the regions of the servers still running (a stand-in /dev/shm)."""
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(process_tree, "SHM_DIR", shm)
    others = shm / f"{FTX_SHM_PREFIX}0123456789ab-region"
    others.write_bytes(b"")
    (ftx_home / "servers").mkdir()
    (ftx_home / "servers" / "gone.json").write_text(
        json.dumps(_server(bystander, name="gone", pid=PID_DEAD, shm_prefix=prefix))
    )
    result = ftx_cli("stop", "gone")
    _assert_clean(result)
    assert result.exit_code == 0, result.stderr
    assert "removed record of gone" in result.stdout and others.exists()
    bystander.assert_alive()
