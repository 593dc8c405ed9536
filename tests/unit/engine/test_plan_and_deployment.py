"""The plan is resolved once and frozen; a served run's lifecycle is the engine's Deployment, not the CLI's."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path
from typing import Any

import pytest


def test_the_plan_of_a_local_checkpoint_resolves_everything_before_fetching(
    plugin_host: Any, ftx_home: Path, tiny_gptj_dir: Path
) -> None:
    from ftx_triton.engine.pipeline import Pipeline
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.store.artifact_store import ArtifactStore

    settings = RunSettings.of(str(tiny_gptj_dir), runtime="python", until="configure", weight_dtype="auto")
    plan = Pipeline(plugin_host, ArtifactStore(ftx_home), settings).plan()
    assert plan.complete and plan.config_is_final and plan.family is not None and plan.family.name == "gptj"
    assert plan.runtime is not None and plan.runtime.name == "python"
    assert plan.settings.convert.weight_dtype != "auto"  # --weight-dtype auto resolved from the checkpoint
    assert plan.settings.configure.data_type == plan.settings.convert.weight_dtype  # python: no default of its own
    assert plan.estimate is not None
    assert settings.convert.weight_dtype == "auto"  # the user's settings are not rewritten
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.settings = settings  # type: ignore[misc]
    assert not list((ftx_home / "store").glob("*/*"))  # planning built nothing


class StoppedByItself:
    """A stand-in deployment (no server can be asked to crash on cue here): it has already exited."""

    name, log_path, metrics_url, pid, stop_hint = "crashed", None, None, None, None

    def __init__(self) -> None:
        self.stopped = 0

    def stop(self) -> None:
        self.stopped += 1

    def wait(self, timeout: float | None = None) -> int:
        return 139

    def detach(self) -> None:
        raise AssertionError("not detached")

    def exit_report(self) -> str:
        return "the server stopped by itself (signal 11)"


class StillRunning(StoppedByItself):
    def wait(self, timeout: float | None = None) -> int:
        raise subprocess.TimeoutExpired("server", timeout or 0)


def _deployment(handle: Any, tmp_path: Path) -> Any:
    from ftx_triton.engine.deployment import Deployment
    from ftx_triton.plan.artifacts import Endpoint, ModelRepository
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.runtime.api import Runtime

    class Plain(Runtime):
        name = "plain"

    return Deployment(
        Endpoint("127.0.0.1:1", "127.0.0.1:2", handle=handle),
        Plain(),
        ModelRepository(tmp_path, "plain", ("ensemble",), "gptj"),
        RunSettings.of("m", openai=False),
        tmp_path,
    )


def test_a_server_that_dies_is_reported_with_its_exit_report_and_stopped(tmp_path: Path) -> None:
    from ftx_triton.errors import ServeError

    handle = StoppedByItself()
    with pytest.raises(ServeError, match="stopped by itself") as err:
        _deployment(handle, tmp_path).serve_until_stopped()
    assert handle.stopped == 1 and "runtime's own log" in (err.value.hint or "")


def test_ctrl_c_stops_the_deployment_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    handle = StillRunning()
    said: list[str] = []

    def interrupted(self: Any, timeout: float | None = None) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(StillRunning, "wait", interrupted)
    _deployment(handle, tmp_path).serve_until_stopped(on_stopping=lambda: said.append("stopping"))
    assert said == ["stopping"] and handle.stopped == 1


def test_a_ctrl_c_python_swallowed_stops_the_deployment_cleanly(tmp_path: Path) -> None:
    from interrupt_helpers import ftx_interrupts_installed, swallowed

    handle = StillRunning()
    said: list[str] = []
    waits = 0

    def swallowed_then_running(self: Any, timeout: float | None = None) -> int:
        nonlocal waits
        waits += 1
        if waits == 1:
            swallowed()  # Ctrl-C while a weakref callback ran during the wait
        assert waits < 3, "the swallowed Ctrl-C did not stop the loop"
        raise subprocess.TimeoutExpired("server", timeout or 0)

    with ftx_interrupts_installed(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(StillRunning, "wait", swallowed_then_running)
        _deployment(handle, tmp_path).serve_until_stopped(on_stopping=lambda: said.append("stopping"))
    assert said == ["stopping"] and handle.stopped == 1 and waits == 1


def test_an_endpoint_without_a_handle_is_a_clear_error(tmp_path: Path) -> None:
    from ftx_triton.errors import ServeError

    with pytest.raises(ServeError, match="without a deployment handle"):
        _deployment(None, tmp_path).server  # noqa: B018 - the property raises
