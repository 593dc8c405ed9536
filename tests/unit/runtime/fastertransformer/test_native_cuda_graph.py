"""GPT-J's decoding step in a CUDA graph (FTX_FT_CUDA_GRAPH=1; ``patch_files/ftx_cuda_graph.*``), without a GPU.

ftx's own C++ (``ftx_cuda_graph.h/.cc``) is compiled with the host compiler against a FAKE CUDA runtime
(``cuda_graph_harness/``: no GPU here) that records what a capturing stream is given and runs it again at each
graph launch, reading "device" memory at that moment as a replayed kernel does. The driver runs forwards as
GptJ's loop does, with an attention kernel that takes its timestep the way the patched dispatch gives it. The
real kernels are built on the GPU machine (``ftx backend build``); tests that need nvcc or the upstream sources
are in test_native_sources.py. These tests skip where no C++ compiler is found.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from fake_cuda_build import compile_driver, copy_patch_files

HARNESS = Path(__file__).parent / "cuda_graph_harness"
FT_STANDINS = Path(__file__).parent / "ft_standins"  # FasterTransformer's logger.h, shared with the loader's test
KERNELS = Path("src/fastertransformer/kernels")


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("graph")
    kernels = root / KERNELS
    copy_patch_files(kernels, "ftx_cuda_graph.h", "ftx_cuda_graph.cc")
    sources = [str(kernels / "ftx_cuda_graph.cc"), str(HARNESS / "fake_cuda.cc"), str(HARNESS / "driver.cc")]
    # the harness first: its cuda_runtime.h and FasterTransformer stand-ins, then the copied patch files
    includes = [f"-I{HARNESS}", f"-I{root}", f"-I{FT_STANDINS}"]
    return compile_driver(root / "driver", *includes, *sources, what="the captured step")


def drive(driver: Path, *args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "FTX_FT_CUDA_GRAPH", "FT_DEBUG"))}
    done = subprocess.run(
        [str(driver), *map(str, args)], capture_output=True, text=True, timeout=60, env=clean | (env or {})
    )
    assert done.returncode == 0, done.stderr
    return done


def kernels(stdout: str) -> list[tuple[int, int, int]]:
    """(timestep the attention kernel read, band of its launch, timestep its launch was sized for) per run."""
    return [tuple(map(int, m)) for m in re.findall(r"^timestep (\d+) band (\d+) sized (\d+)$", stdout, re.M)]


def band(timestep: int) -> int:
    """mmha_launch_kernel's configuration band (see test_native_sources: checked against every launcher)."""
    return 0 if timestep < 32 else 1 if timestep < 2048 else 2


def forward(max_input: int, max_output: int, prefix: int = 0) -> list[int]:
    """The timesteps GptJ's decoder layers run at in one forward (none at the context step)."""
    steps = [s for s in range(max_input, max_output) if not (max_input > 1 and s == max_input)]
    return [s + prefix - 1 for s in steps]


@pytest.mark.parametrize(
    ("value", "debug", "default", "on", "problem"),
    [
        ("-", "-", "off", False, ""),
        ("", "-", "off", False, ""),
        ("-", "-", "on", True, ""),
        ("", "-", "on", True, ""),
        ("0", "-", "on", False, ""),
        ("0", "-", "off", False, ""),
        ("1", "-", "off", True, ""),
        ("1", "INFO", "off", True, ""),
        ("true", "-", "on", False, "FTX_FT_CUDA_GRAPH='true' is neither 1 nor 0"),
        (" 1", "-", "off", False, "FTX_FT_CUDA_GRAPH=' 1' is neither 1 nor 0"),
        ("1", "DEBUG", "off", False, "FT_DEBUG_LEVEL=DEBUG synchronizes after every kernel"),
        ("-", "DEBUG", "on", False, "FT_DEBUG_LEVEL=DEBUG synchronizes after every kernel"),
        ("0", "DEBUG", "on", False, ""),
    ],
)
def test_the_environment_variable_decides_and_unset_leaves_the_types_default(
    driver: Path, value: str, debug: str, default: str, on: bool, problem: str
) -> None:
    """1 or 0 decide whatever the model's type; unset or empty leaves the type's default (on in fp16). A stranger's
    value is refused with a line that names it (the server logs it once) and keeps the capture off even where the
    default is on; FasterTransformer's debug level syncs the device after each kernel, which no capture survives,
    so it keeps the capture off, and says so only where the capture would have been on."""
    said, why = drive(driver, "setting", value, debug, default).stdout.split("\n")[:2]
    assert said == ("on" if on else "off")
    assert why.startswith(problem) and bool(why) == bool(problem)


def test_a_forward_runs_its_first_step_eagerly_then_replays_one_graph_reading_each_steps_timestep(driver: Path) -> None:
    """Prompt of 4, 12 new tokens: the first decoder step runs eagerly (its buffers are sized outside any capture),
    the second is captured and launched, the rest replay it. Every step's attention reads its own timestep, in
    order, once; every launch is sized for the forward's largest timestep in the band its own timestep picks
    (the eager path's configuration, so the same kernel runs); nothing is left allocated at the end."""
    done = drive(driver, "forward", 4, 16, 0, 1, "ok")
    ran = kernels(done.stdout)
    assert [t for t, _b, _s in ran] == forward(4, 16)
    assert ran[0] == (4, 0, 4)  # eager: sized for itself
    assert all(b == band(t) and s == 14 for t, b, s in ran[1:])  # replayed: sized for the last timestep, 14
    assert "instantiated 1" in done.stdout and "graphs alive 0 allocations 0" in done.stdout
    assert done.stderr.count("captured in a CUDA graph") == 1 and "WARNING" not in done.stderr


def test_a_step_that_enters_the_next_launch_band_is_captured_again(driver: Path) -> None:
    """Timesteps 26..40 cross 32, where the launcher picks another block size: the graph of the first band is
    dropped and the next band's is captured, so each replayed kernel is the one the eager path would launch."""
    done = drive(driver, "forward", 27, 42, 0, 1, "ok")
    ran = kernels(done.stdout)
    assert [t for t, _b, _s in ran] == forward(27, 42)
    assert all(b == band(t) for t, b, _s in ran)
    assert all(s >= t and band(s) == band(t) for t, _b, s in ran)
    assert "instantiated 2" in done.stdout


def test_each_forward_captures_its_own_graph_and_prefix_prompts_shift_the_timestep(driver: Path) -> None:
    """Buffers may move between forwards (another batch size): each forward drops the last graph. A prefix
    prompt of 10 moves every timestep by 10, as the dispatch computes it."""
    done = drive(driver, "forward", 8, 14, 0, 1, "ok", 5, 12, 10, 1, "ok")
    ran = kernels(done.stdout)
    assert [t for t, _b, _s in ran] == forward(8, 14) + forward(5, 12, prefix=10)
    assert "forward done: instantiated 1" in done.stdout and "forward done: instantiated 2" in done.stdout
    assert "graphs alive 0 allocations 0" in done.stdout


@pytest.mark.parametrize(
    ("mode", "env", "why"),
    [
        ("unsafe", {}, "cudaStreamEndCapture: operation failed due to a previous error during capture"),
        ("throw", {}, "operation not permitted when stream is capturing"),
        ("ok", {"FAKE_INSTANTIATE_FAIL": "1"}, "cudaGraphInstantiate"),
        ("ok", {"FAKE_BEGIN_FAIL": "1"}, "cudaStreamBeginCapture"),
    ],
)
def test_a_capture_that_fails_says_so_once_and_the_forward_runs_every_step_eagerly(
    driver: Path, mode: str, env: dict[str, str], why: str
) -> None:
    """A call no capture allows (ignored or checked by FasterTransformer), an instantiation or a capture start
    that fails: one warning per forward, and the step that was being captured runs eagerly, as do the rest of the
    forward's steps — every timestep once, in order (never a step skipped or run twice); the next forward tries
    again."""
    done = drive(driver, "forward", 6, 12, 0, 1, mode, 6, 12, 0, 1, mode, env=env)
    ran = kernels(done.stdout)
    assert [t for t, _b, _s in ran] == forward(6, 12) * 2
    assert all(s == t for t, _b, s in ran)  # eager launches, sized for their own timestep
    warnings = [line for line in done.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 2 and all(why in w and "this forward runs eagerly" in w for w in warnings)
    assert "instantiated 0" in done.stdout and "graphs alive 0 allocations 0" in done.stdout


def test_an_unusable_forward_never_captures(driver: Path) -> None:
    """Beam width > 1, pipeline stages, buffers freed after each forward: GptJ passes usable=false."""
    done = drive(driver, "forward", 4, 10, 0, 0, "unsafe")
    assert [t for t, _b, _s in kernels(done.stdout)] == forward(4, 10)
    assert "instantiated 0" in done.stdout and done.stderr == ""


def test_the_band_of_a_timestep_ends_where_the_launcher_changes_its_block_size(driver: Path) -> None:
    lines = drive(driver, "bands", 0, 31, 32, 2047, 2048, 100000).stdout.split()
    got = {int(t): (int(b), int(last)) for t, b, last in zip(lines[::3], lines[1::3], lines[2::3], strict=True)}
    assert {t: b for t, (b, _last) in got.items()} == {t: band(t) for t in got}
    assert got[0][1] == 31 and got[32][1] == 2047 and got[2048][1] >= 1 << 30
