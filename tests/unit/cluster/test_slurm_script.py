"""The Slurm launcher's batch script and its export, without a cluster (`--dry-run`, `ftx export slurm`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ftx_triton.cluster.slurm.script import SlurmRequest, render
from ftx_triton.errors import ConfigError


def _request(home: Path, **over: object) -> SlurmRequest:
    values: dict[str, object] = {
        "name": "gj",
        "model": "/models/my gptj",
        "run_args": ("--runtime", "fastertransformer-native", "--tp", "8", "--pp", "2"),
        "home": home,
        "python": "/opt/ftx/bin/python",
        "nodes": 2,
        "gpus_per_node": 8,
        "gpu_type": "h100",
        "partition": "gpu",
        "time_limit": "1-00:00:00",
        "sbatch": ("--account=ml",),
    }
    return SlurmRequest(**{**values, **over})  # type: ignore[arg-type]


def test_script_asks_for_the_nodes_and_gpus_and_runs_the_three_steps_in_order(tmp_path: Path) -> None:
    text = render(_request(tmp_path), "tok")
    for directive in (
        "--job-name=ftx-gj",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--gpus-per-node=h100:8",
        "--partition=gpu",
        "--time=1-00:00:00",
        "--account=ml",
        f"--output={tmp_path}/slurm/gj/job-%j.log",
    ):
        assert f"#SBATCH {directive}\n" in text
    steps = [line for line in text.splitlines() if line.startswith("srun ")]
    assert len(steps) == 3
    assert "--token tok check-shared" in steps[0] and "--ntasks-per-node=1" in steps[0]
    assert "--nodes=1 --ntasks=1" in steps[1] and " prepare -- '/models/my gptj' --runtime" in steps[1]
    assert " serve -- '/models/my gptj' --runtime fastertransformer-native --tp 8 --pp 2" in steps[2]
    assert f"export FTX_HOME={tmp_path}\n" in text and "export FTX_CLUSTER_DEPLOYMENT=gj\n" in text


def test_a_line_break_in_any_value_is_refused(tmp_path: Path) -> None:
    """In an #SBATCH line a line break would start a line bash runs."""
    with pytest.raises(ConfigError, match="control character"):
        render(_request(tmp_path, sbatch=("--comment=x\ntouch /tmp/owned",)), "tok")
    with pytest.raises(ConfigError, match="control character"):
        render(_request(tmp_path, partition="gpu\rx"), "tok")


def test_container_image_runs_every_step_in_it_with_ftx_home_mounted(tmp_path: Path) -> None:
    text = render(_request(tmp_path, container_image="registry/ftx:1"), "tok")
    steps = [line for line in text.splitlines() if line.startswith("srun ")]
    assert all(f"--container-image=registry/ftx:1 --container-mounts={tmp_path}:{tmp_path}" in s for s in steps)


def test_dry_run_prints_the_script_and_writes_nothing(ftx_cli, ftx_home: Path) -> None:  # type: ignore[no-untyped-def]
    result = ftx_cli("slurm", "run", "--dry-run", "tiny-gptj", "--tp", "2")  # tp 2 on one node: 2 GPUs
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("#!/bin/bash\n#SBATCH --job-name=ftx-tiny-gptj\n")
    assert "#SBATCH --gpus-per-node=2\n" in result.stdout and " serve -- tiny-gptj --tp 2" in result.stdout
    assert not (ftx_home / "slurm").exists()


def test_export_writes_the_script_and_refuses_a_link(ftx_cli, ftx_home: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "job.sh"
    result = ftx_cli("export", "slurm", "-o", str(out), "--name", "mine", "tiny-gptj", "--runtime", "python")
    assert result.exit_code == 0, result.stderr
    text = out.read_text()
    assert "#SBATCH --job-name=ftx-mine" in text
    token = (ftx_home / "slurm" / "mine" / "shared-token").read_text().strip()
    assert f"--token {token} check-shared" in text  # the job's check finds the token this wrote
    link = tmp_path / "link.sh"
    os.symlink(tmp_path / "elsewhere", link)
    refused = ftx_cli("export", "slurm", "-o", str(link), "--name", "other", "tiny-gptj")
    assert refused.exit_code == 1 and "is not a regular file" in refused.stderr
    assert not (tmp_path / "elsewhere").exists() and not (ftx_home / "slurm" / "other").exists()
