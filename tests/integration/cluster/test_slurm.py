"""The Slurm launcher against a REAL one-node Slurm cluster (Debian's slurm-wlm and munge, started by
``slurm_cluster``): the built-in tiny-gptj on the python runtime submitted with `ftx slurm run`, listed by
`ftx ps`, asked by `ftx generate`, ended by `ftx stop` with nothing left; a server that dies and a job the
scheduler cancels show their cause in `ftx ps`; bad requests refused before anything is submitted; two
ranks under ``srun --mpi=pmix`` through ftx's rank launcher (a shell command stands in for tritonserver:
no GPU or FasterTransformer backend here)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import SlurmCluster

FTX = (sys.executable, "-m", "ftx_triton")
RUN = ("slurm", "run", "--timeout", "300")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, built_demo: Path) -> Path:
    """An FTX_HOME whose built-in tiny-gptj is already built (a copy of the session's build)."""
    from fetch_helpers import seed_demo

    home = tmp_path_factory.mktemp("slurm-home")
    seed_demo(home, built_demo)
    return home


def _env(cluster: SlurmCluster, home: Path) -> dict[str, str]:
    return {**cluster.env, "FTX_HOME": str(home), "FTX_DEVICE": "cpu"}


def _ftx(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FTX, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)


def _ps(env: dict[str, str]) -> dict[str, dict[str, object]]:
    result = _ftx("ps", "--json", env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    return {row["name"]: row for row in json.loads(result.stdout) if row.get("scheduler") == "slurm"}


def _tritonservers_of(home: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = Path(entry, "cmdline").read_bytes()
        except OSError:
            continue
        if b"tritonserver" in cmdline.split(b"\0")[0] and str(home).encode() in cmdline:
            found.append(int(entry.name))
    return found


def _gone(cluster: SlurmCluster, home: Path, timeout_s: float = 30) -> None:
    """No job queued or running, no tritonserver of ``home``, no step daemon of the cluster."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not cluster.jobs() and not _tritonservers_of(home) and not cluster.step_daemons():
            return
        time.sleep(0.3)
    raise AssertionError(
        f"left: jobs {cluster.jobs()}, servers {_tritonservers_of(home)}, steps {cluster.step_daemons()}"
    )


def test_submitted_deployment_is_listed_answers_and_stop_leaves_nothing(
    slurm_cluster: SlurmCluster, home: Path
) -> None:
    env = _env(slurm_cluster, home)
    run = _ftx(*RUN, "--name", "gj", "tiny-gptj", "--runtime", "python", env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "left running as 'gj' (Slurm job" in run.stdout and "Triton HTTP  http://127.0.0.1:" in run.stdout
    row = _ps(env)["gj"]
    assert row["state"] == "running" and row["model"] == "tiny-gptj" and str(row["where"]).startswith("slurm job ")
    table = _ftx("ps", env=env, timeout=60).stdout
    assert "gj" in table and "running" in table and "(foreground)" not in table  # listed once, as the job
    generated = _ftx("generate", "gj", "Once upon a time", "--max-tokens", "4", env=env, timeout=120)
    assert generated.returncode == 0 and generated.stdout.startswith("Once upon a time"), generated.stderr[-2000:]
    assert len(generated.stdout) > len("Once upon a time")
    bench = _ftx("bench", "gj", "--tool", "builtin", "--concurrency", "1", "--requests", "2", "--json", env=env)
    assert bench.returncode == 0, bench.stderr[-2000:]
    stop = _ftx("stop", "gj", env=env, timeout=240)
    assert stop.returncode == 0 and "stopped gj (slurm job" in stop.stdout, stop.stderr
    _gone(slurm_cluster, home)
    assert not (home / "slurm" / "gj").exists() and "gj" not in _ps(env)


def test_a_server_that_dies_ends_the_job_with_its_cause_in_ps(slurm_cluster: SlurmCluster, home: Path) -> None:
    """tritonserver killed (SIGKILL, as the OOM killer or a crash would end it): the job ends FAILED and
    `ftx ps` says so with ftx's own error line; `ftx stop` removes the records."""
    env = _env(slurm_cluster, home)
    run = _ftx(*RUN, "--name", "dies", "tiny-gptj", "--runtime", "python", env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    try:
        for pid in _tritonservers_of(home):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        states = []  # "ending" (the server is gone, Slurm still ends the job) may come first, then "ended"
        while (row := _ps(env)["dies"])["state"] != "ended" and time.monotonic() < deadline:
            states.append(row["state"])
            time.sleep(0.5)
        assert row["state"] == "ended" and "job FAILED" in str(row["cause"]), (row, states)
        assert "error:" in str(row["cause"]) and "SIGKILL" in str(row["cause"]), row
        assert set(states) <= {"running", "ending"}, states
        shown = _ftx("ps", env=env, timeout=60)
        assert "dies (slurm job" in shown.stderr and "job FAILED" in shown.stderr
    finally:  # a failure here must not leave its records to the next test's home
        assert _ftx("stop", "dies", env=env, timeout=120).returncode == 0
    _gone(slurm_cluster, home)


def test_a_job_the_scheduler_cancels_shows_why(slurm_cluster: SlurmCluster, home: Path) -> None:
    env = _env(slurm_cluster, home)
    run = _ftx("slurm", "run", "--no-wait", "--name", "cut", "tiny-gptj", "--runtime", "python", env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    job = json.loads((home / "slurm" / "cut" / "job.json").read_text())["job_id"]
    assert slurm_cluster.run("scancel", job).returncode == 0  # the admin, a preemption: not ftx
    deadline = time.monotonic() + 60
    while (row := _ps(env)["cut"])["state"] != "ended" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert row["state"] == "ended" and "job CANCELLED" in str(row["cause"]), row
    assert _ftx("stop", "cut", env=env, timeout=120).stdout.startswith("removed the records of cut")
    _gone(slurm_cluster, home)


def test_a_partition_that_does_not_exist_is_refused_before_submission(slurm_cluster: SlurmCluster, home: Path) -> None:
    env = _env(slurm_cluster, home)
    result = _ftx("slurm", "run", "--partition", "nope", "--name", "np", "tiny-gptj", env=env, timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "error: Slurm refuses the job: invalid partition" in result.stderr and "hint: `sinfo -s`" in result.stderr
    gres = _ftx("slurm", "run", "--gpus-per-node", "1", "--gpu-type", "h100", "tiny-gptj", env=env, timeout=60)
    assert gres.returncode == 1 and "error: Slurm refuses the job" in gres.stderr, gres.stderr
    assert not slurm_cluster.jobs() and not (home / "slurm" / "np").exists()


def test_an_ftx_home_the_nodes_cannot_see_is_refused_before_submission(slurm_cluster: SlurmCluster, home: Path) -> None:
    """Partition ``far`` is another machine (ghost); FTX_HOME here is on this machine's own disk."""
    env = _env(slurm_cluster, home)
    result = _ftx("slurm", "run", "--partition", "far", "--name", "far", "tiny-gptj", env=env, timeout=60)
    assert result.returncode == 1 and "node ghost of partition far cannot see" in result.stderr, result.stderr
    assert "hint: point FTX_HOME at storage every node mounts" in result.stderr
    assert not slurm_cluster.jobs() and not (home / "slurm" / "far").exists()


def test_options_ftx_run_refuses_are_refused_before_submission(slurm_cluster: SlurmCluster, home: Path) -> None:
    env = _env(slurm_cluster, home)
    bad = _ftx("slurm", "run", "tiny-gptj", "--tp", "zero", env=env, timeout=60)
    assert bad.returncode == 1 and "error: ftx run would refuse these options" in bad.stderr, bad.stderr
    detach = _ftx("slurm", "run", "tiny-gptj", "--detach", env=env, timeout=60)
    assert detach.returncode == 1 and "`ftx run --detach` has no meaning here" in detach.stderr
    assert not slurm_cluster.jobs() and not list(home.glob("slurm/*"))


def test_two_ranks_under_srun_pmix_through_the_rank_launcher(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """srun --mpi=pmix starts two tasks; ftx's rank launcher gives each its GPU and shm prefix from Slurm's
    rank variables and execs the server command (``sh`` stands in for tritonserver), exactly as under mpirun."""
    command = 'echo "rank=$FTX_MPI_RANK gpus=$CUDA_VISIBLE_DEVICES $0"'
    argv = ["srun", "--mpi=pmix", "-n", "2", sys.executable, "-m", "ftx_triton.runtime.fastertransformer.native.rank"]
    argv += ["--gpus=0,1", "--per-rank=1", "--", "sh", "-c", command]
    argv += ["--backend-config=python,shm-region-prefix-name=triton_python_backend_shm_region_ftx-ab-"]
    result = slurm_cluster.run(*argv, timeout=120)
    assert result.returncode == 0, result.stderr
    assert sorted(line for line in result.stdout.splitlines() if line.startswith("rank=")) == [
        "rank=0 gpus=0 --backend-config=python,shm-region-prefix-name=triton_python_backend_shm_region_ftx-ab-",
        "rank=1 gpus=1 --backend-config=python,shm-region-prefix-name=triton_python_backend_shm_region_ftx-ab-r1-",
    ]
