"""The servers ftx spawns inherit the environment the console script started with, not what imports wrote to it
since (``torch._dynamo`` writes ``TORCHINDUCTOR_CACHE_DIR``): a run that built and a cached run of the same request
must spawn the same server for the head start to match."""

from __future__ import annotations

from pathlib import Path

import pytest
from ftx_triton import start_environ
from ftx_triton.server.install import TritonInstall, server_env

INSTALL = TritonInstall(Path("/x/tritonserver"), Path("/x/backends"), Path("/x/stub"), Path("/x/libs"), "3.11")


def test_what_an_import_writes_after_the_start_is_not_inherited(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(start_environ, "_started_with", None)
    monkeypatch.setenv("FTX_TEST_SET_BY_USER", "kept")
    start_environ.remember()
    monkeypatch.setenv("FTX_TEST_WRITTEN_BY_AN_IMPORT", "/tmp/cache")
    env = server_env(INSTALL, {"FTX_GIVEN": "1"})
    assert env["FTX_TEST_SET_BY_USER"] == "kept" and env["FTX_GIVEN"] == "1"
    assert "FTX_TEST_WRITTEN_BY_AN_IMPORT" not in env


def test_in_process_callers_pass_the_live_environment_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(start_environ, "_started_with", None)
    monkeypatch.setenv("FTX_TEST_SET_BY_A_TEST", "1")
    assert server_env(INSTALL)["FTX_TEST_SET_BY_A_TEST"] == "1"
