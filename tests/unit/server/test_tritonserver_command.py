"""tritonserver's command line as ftx builds it (no server started)."""

from __future__ import annotations

from pathlib import Path

from ftx_triton.server.tritonserver import TritonServer


def _command(tmp_path: Path, **options: object) -> list[str]:
    repository = tmp_path / "repo"
    repository.mkdir(exist_ok=True)
    server = TritonServer(repository, home=tmp_path / "home", **options)  # type: ignore[arg-type]
    return server.command(tmp_path / "backends", tmp_path / "tritonserver")


def test_gpu_metrics_are_left_to_tritonserver_unless_the_deployment_runs_on_the_cpu(tmp_path: Path) -> None:
    assert "--allow-metrics=true" in _command(tmp_path)
    assert not any(flag.startswith("--allow-gpu-metrics") for flag in _command(tmp_path))
    assert "--allow-gpu-metrics=false" in _command(tmp_path, gpu_metrics=False)
