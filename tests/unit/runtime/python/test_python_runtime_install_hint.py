"""The python runtime's missing pieces are named with the commands that really install them: the ``serve`` extra
is empty (nvidia-pytriton must come without its numpy<2 pin, which no extra can say), so a hint of
``pip install 'ftx-triton[torch,serve]'`` brought no tritonserver."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from ftx_triton.plan.settings import RunSettings
from ftx_triton.runtime.python.plugin import PythonRuntime
from ftx_triton.store.artifact_store import ArtifactStore


@pytest.mark.parametrize(
    ("hidden", "line"),
    [
        ({"pytriton"}, "pip install --no-deps nvidia-pytriton"),
        ({"torch", "pytriton"}, "pip install 'ftx-triton[torch]' && pip install --no-deps nvidia-pytriton"),
        ({"transformers"}, "pip install 'ftx-triton[torch]'"),
    ],
)
def test_the_hint_installs_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hidden: set[str], line: str
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:  # stands in for an environment without these packages
        return None if name in hidden else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    availability = PythonRuntime().available(RunSettings.of("tiny-gptj"), ArtifactStore(tmp_path))
    assert not availability.ok and availability.reason.endswith(f"({line})"), availability.reason
    assert "serve]" not in availability.reason


def test_a_tritonserver_install_of_ones_own_stands_in_for_the_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With FTX_TRITONSERVER_DIR naming a tritonserver install, the nvidia-pytriton wheel is not needed (the
    server is found there: a GPU image's own Triton); torch and transformers still are."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pytriton" else real(name, *a))
    monkeypatch.setenv("FTX_TRITONSERVER_DIR", str(tmp_path / "tritonserver"))
    assert PythonRuntime().available(RunSettings.of("tiny-gptj"), ArtifactStore(tmp_path)).ok
    monkeypatch.delenv("FTX_TRITONSERVER_DIR")
    assert not PythonRuntime().available(RunSettings.of("tiny-gptj"), ArtifactStore(tmp_path)).ok
