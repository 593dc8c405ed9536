"""Fault injection: real `ftx run` processes SIGKILLed at seeded random points inside each stage.

Nothing is faked: the CLI runs as a subprocess (its own process group, killed whole), the store is on
disk, and the serve-stage faults kill a real tritonserver start-up. After every kill no process of that
FTX_HOME is left, the next run finishes, and every published artifact is byte-identical to the one a
clean run published; the store holds no temporary or half-replaced directories, and a killed server
start leaves no Python-backend shared-memory region behind.

FTX_FAULT_SEED and FTX_FAULT_ROUNDS (kills per kill point, 1 by default: the seed is fixed, so a second
round in CI is one more fixed delay, not a new path) widen a campaign run by hand; the printed line gives
kills landed and runs recovered.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from triton_helpers import home_shm_prefixes

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("FTX_FAULT_SEED", "20261124"))
ROUNDS = max(1, int(os.environ.get("FTX_FAULT_ROUNDS", "1")))
FTX = [sys.executable, "-c", "from ftx_triton.cli import main; main()"]
SHM = Path("/dev/shm")
SHM_PREFIX = "triton_python_backend_shm_region_ftx-"
STAGES = ("fetch", "convert", "tune", "configure")


def _env(home: Path) -> dict[str, str]:
    # verbose: a one-shot --prompt run holds its step lines back otherwise, and the kills wait for them
    return {**os.environ, "FTX_HOME": str(home), "FTX_DEVICE": "cpu", "PYTHONUNBUFFERED": "1", "FTX_VERBOSE": "1"}


def _artifacts(home: Path) -> dict[str, str]:
    """sha256 of every file of every published artifact, by its path under the store (provenance aside:
    it records when and how long, which differ from run to run)."""
    found = {}
    for stage in STAGES:
        for path in sorted((home / "store" / stage).rglob("*")):
            if path.is_file() and path.name != "ftx-artifact.json":
                found[path.relative_to(home / "store").as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def _leftovers(home: Path) -> list[str]:
    """Temporary builds, half-replaced artifacts and unfinished tmp dirs in the store."""
    store = home / "store"
    left = [p.name for p in (store / ".tmp").iterdir()] if (store / ".tmp").exists() else []
    for stage in STAGES:
        if (store / stage).exists():
            left += [f"{stage}/{p.name}" for p in (store / stage).iterdir() if not (p / "ftx-artifact.json").is_file()]
    return left


def _processes_of(home: Path) -> list[str]:
    """Processes that still belong to runs with this FTX_HOME (by command line or environment)."""
    mine = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid == os.getpid():
                continue
            text = " ".join(proc.info["cmdline"] or [])
            if str(home) in text or proc.environ().get("FTX_HOME") == str(home):
                mine.append(f"{proc.pid} {text[:120]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return mine


def _wait_for_none(home: Path, timeout_s: float = 15.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while (left := _processes_of(home)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _run_and_kill(argv: list[str], home: Path, trigger: str, delay_s: float, timeout_s: float = 300) -> bool:
    """Start ``ftx`` and SIGKILL its whole process group ``delay_s`` after ``trigger`` appears on stderr;
    True if it was killed, False if it finished first."""
    proc = subprocess.Popen(
        [*FTX, *argv],
        env=_env(home),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    fired = threading.Event()

    def watch() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if not fired.is_set() and trigger in line:
                fired.set()
                time.sleep(delay_s)
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    reader = threading.Thread(target=watch, daemon=True)
    reader.start()
    code = proc.wait(timeout=timeout_s)
    reader.join(timeout=10)
    return code == -signal.SIGKILL


def _complete(argv: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*FTX, *argv], env=_env(home), capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


# (what to wait for on stderr, so that the kill lands in the stage named) per stage
KILL_POINTS = [
    ("fetch", '"event": "convert.weight_dtype_chosen"'),
    ("convert", '"stage": "fetch"'),
    ("convert", '"event": "conversion.finished"'),
    ("tune", '"stage": "convert"'),
    ("configure", '"stage": "tune"'),
    ("configure", '"event": "configure.tokenizer_larger_than_model"'),
]


def test_a_kill_anywhere_in_the_stages_recovers_byte_identical(tiny_gptj_dir: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    argv = ["run", str(tiny_gptj_dir), "--runtime", "python", "--until", "configure", "--log-format", "json"]
    _complete(argv, home)
    reference = _artifacts(home)
    assert {key.split("/", 1)[0] for key in reference} >= {"convert", "configure"}  # a local source stays in place
    rng = random.Random(SEED)
    killed, survived = 0, 0
    for stage, trigger in KILL_POINTS:
        for _ in range(ROUNDS):
            delay = rng.uniform(0.0, 0.03)
            shutil.rmtree(home)
            where = f"seed {SEED}: kill in {stage} ({delay * 1000:.0f} ms after {trigger})"
            if _run_and_kill(argv, home, trigger, delay):
                killed += 1
            assert not _wait_for_none(home), where
            _complete(argv, home)
            assert _artifacts(home) == reference, where
            assert not _leftovers(home), (where, _leftovers(home))
            survived += 1
    print(f"fault injection: {killed} kills landed (of {survived} runs), {survived} recovered byte-identical")
    assert 2 * killed >= len(KILL_POINTS) * ROUNDS  # most kills land before the run ends


def test_a_kill_during_server_start_leaves_no_process_or_shared_memory(tiny_gptj_dir: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    argv = [
        "run",
        str(tiny_gptj_dir),
        "--runtime",
        "python",
        "--prompt",
        "Once upon a time",
        "--max-tokens",
        "4",
        "--no-openai",
    ]
    _complete(["run", str(tiny_gptj_dir), "--runtime", "python", "--until", "configure"], home)
    before = {p.name for p in SHM.iterdir()} if SHM.exists() else set()
    rng = random.Random(SEED)
    for trigger in ("starting tritonserver", "loading model", "loaded model"):
        delay = rng.uniform(0.0, 1.5)
        where = f"seed {SEED}: kill {delay:.2f} s after {trigger!r}"
        assert _run_and_kill(argv, home, trigger, delay), where
        assert not _wait_for_none(home), where  # tritonserver and its stubs died with ftx
    # a SIGKILL leaves no process that could unlink the regions of the killed servers: the next server
    # start sweeps what dead servers left, and the deployment comes up as if nothing had happened
    done = _complete(argv, home)
    assert done.stdout.strip().startswith("Once upon a time")
    assert not _wait_for_none(home)
    after = {p.name for p in SHM.iterdir()} if SHM.exists() else set()
    ours = home_shm_prefixes(home)  # servers of other test runs on this machine make regions too
    assert ours and not [n for n in after - before if n.startswith(ours)], f"seed {SEED}"
