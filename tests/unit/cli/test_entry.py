"""The ``ftx`` console script ends its process as ``sys.exit`` would (code, message, atexit handlers, flushed
output), without the interpreter's teardown; a thread still running is waited for as usual."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import atexit, sys, threading, time
from ftx_triton.entry import end
atexit.register(lambda: print("atexit ran"))
if {thread}:
    threading.Thread(target=lambda: (time.sleep(0.3), print("thread done"))).start()
print("said", end=" ")
end({code!r})
print("never")
"""


@pytest.mark.parametrize(
    ("code", "status", "stderr"), [(None, 0, ""), (0, 0, ""), (3, 3, ""), ("error: boom", 1, "error: boom\n")]
)
@pytest.mark.parametrize("thread", [False, True])
def test_the_console_script_ends_as_sys_exit_would(code: object, status: int, stderr: str, thread: bool) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(code=code, thread=thread)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == status
    assert done.stderr == stderr
    expected = ["said", "atexit", "ran"] if not thread else ["said", "thread", "done", "atexit", "ran"]
    assert done.stdout.split() == expected


POOL_PROBE = """
import atexit, time
from concurrent.futures import ThreadPoolExecutor
from ftx_triton.entry import end
class Teardown:
    def __del__(self):
        print("teardown")
kept = Teardown()
atexit.register(lambda: print("atexit ran"))
ThreadPoolExecutor(1).submit(lambda: (time.sleep(0.3), print("task done")))
print("said", end=" ")
end(0)
"""


def test_a_pool_left_by_the_command_is_waited_for_without_the_teardown() -> None:
    """A first conversion leaves its reading pool's (non-daemon) workers: the exit still waits for their work, as
    the usual exit does, and then skips the interpreter's teardown (module globals are not collected)."""
    done = subprocess.run([sys.executable, "-c", POOL_PROBE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.split() == ["said", "task", "done", "atexit", "ran"]


RUN_PROBE = """
import atexit, json, sys
sys.argv = ["ftx", "-v", "run", {source!r}, "--detach"]
atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=sys.stderr))
from ftx_triton.entry import main
main()
"""
UNUSED_RICH = ("rich.traceback", "rich.pretty", "rich.progress", "pygments")


def test_a_run_imports_structlog_without_richs_tracebacks_and_no_progress_bar(tmp_path: Path) -> None:
    """The ``ftx`` command's CPU runs beside a cached run's model load on small machines: structlog comes without
    rich's traceback and pretty-printer (0.05-0.1 CPU-s with pygments; ftx's own renderers never use them), and
    rich's progress bars are imported only when one is drawn. A run that plans and fails on its source."""
    done = subprocess.run(
        [sys.executable, "-c", RUN_PROBE.format(source=str(tmp_path / "missing"))],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "FTX_HOME": str(tmp_path / "home")},
    )
    assert done.returncode == 1 and "error: unknown model source" in done.stderr
    loaded = set(json.loads(done.stderr.strip().splitlines()[-1]))
    assert {"structlog", "rich.console", "ftx_triton.engine.pipeline"} <= loaded  # (no download or archive either)
    assert not {name for name in loaded if name.startswith(UNUSED_RICH)}, sorted(loaded)


CONVERT_PROBE = """
import atexit, json, sys
sys.argv = ["ftx", "-v", "convert", {source!r}, "--tp", "1", "--weight-dtype", "fp32", "-o", {output!r}]
atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=sys.stderr))
from ftx_triton.entry import main
main()
"""
NOT_FOR_CONVERT = (
    "ftx_triton.server.head_start",  # only `ftx run` starts a server ahead
    "ftx_triton.engine.deployment",  # a served model's lifecycle and its HTTP client
    "ftx_triton.client",
    "ftx_triton.fetching.http",  # downloads and archives: not for a local directory
    "ftx_triton.fetching.archive",
    "urllib.request",
    "http.client",
    "ftx_triton.server.install",  # the runtimes' availability checks: no runtime decides these files
    "ftx_triton.runtime.fastertransformer.native.build",
    "ftx_triton.runtime.fastertransformer.native.toolchain",
    "asyncio",  # structlog's, for its async methods alone (imported at their first use)
    "psutil",  # the available RAM: a plan asks only where the model is to be loaded in RAM
)


@pytest.mark.parametrize("cached", [False, True], ids=["first", "cached"])
def test_a_conversion_with_its_dtype_and_tp_named_imports_only_what_converting_needs(
    tmp_path: Path, tiny_gptj_dir: Path, cached: bool
) -> None:
    """`ftx convert SRC --tp N --weight-dtype D` of a local directory (the copy bound's benchmark) starts without a
    run's head start, a deployment's client, the fetching of URLs and archives, or a runtime's host probe: the
    files are the same whatever runtime would serve them."""
    env = {**os.environ, "FTX_HOME": str(tmp_path / "home")}
    code = CONVERT_PROBE.format(source=str(tiny_gptj_dir), output=str(tmp_path / "out"))
    for _ in range(2 if cached else 1):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
    assert ("convert   cached" in done.stderr) is cached
    assert "runtime   " not in done.stderr  # no runtime was chosen, so none is named
    loaded = set(json.loads(done.stderr.strip().splitlines()[-1]))
    assert "ftx_triton.engine.pipeline" in loaded
    assert not {name for name in loaded if name.startswith(NOT_FOR_CONVERT)}, sorted(loaded)


IMPORTING_THREAD_PROBE = """
import sys, threading
class Seen:
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            beside = sorted(thread.name for thread in threading.enumerate() if thread is not threading.current_thread())
            print("imported by " + threading.current_thread().name + " beside " + ",".join(beside), file=sys.stderr)
sys.meta_path.insert(0, Seen())
sys.argv = ["ftx", "convert", {source!r}, "--tp", "1", "--weight-dtype", "fp32", "-o", {output!r}]
from ftx_triton.entry import main
main()
"""


def _first_convert_importing(module: str, tmp_path: Path, source: Path) -> tuple[str, list[str]]:
    """(the thread, the other threads alive) when a first convert of ``source`` imported ``module``."""
    env = {**os.environ, "FTX_HOME": str(tmp_path / "home")}
    code = IMPORTING_THREAD_PROBE.format(module=module, source=str(source), output=str(tmp_path / "out"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    said = [line for line in done.stderr.splitlines() if line.startswith("imported by ")]
    assert len(said) == 1, done.stderr[-2000:]
    thread, _, beside = said[0].removeprefix("imported by ").partition(" beside ")
    return thread, beside.split(",")


def test_a_first_conversion_imports_its_lock_library_in_the_source_key_thread(
    tmp_path: Path, tiny_gptj_dir: Path
) -> None:
    """A first convert publishes under a file lock, after the conversion: filelock (0.1 s on some hosts) is
    imported by the thread that hashes the source once it has the key, while the conversion still runs, not by
    the main thread after it."""
    thread, _ = _first_convert_importing("filelock", tmp_path, tiny_gptj_dir)
    assert thread == "ftx-source-key"


def test_a_first_conversion_imports_numpy_before_the_source_is_hashed_beside_it(
    tmp_path: Path, tiny_gptj_dir: Path
) -> None:
    """The converter's numpy is imported before the source's hashing threads start: beside them its import
    waited on the GIL (0.5 s instead of 0.2-0.3 s on a 32-CPU host)."""
    thread, beside = _first_convert_importing("numpy", tmp_path, tiny_gptj_dir)
    assert thread == "MainThread"
    assert not [name for name in beside if name.startswith(("ftx-source-key", "ftx-hash"))], beside


NOT_WHEN_CACHED = ("numpy", "ml_dtypes", "filelock")  # tensors' readers and writers, a build's lock
DTYPE_KEYS = ("torch_dtype", "dtype")  # config.json names the dtype under either (transformers 4, 5)


@pytest.mark.parametrize("dtype_named", [True, False], ids=["config-dtype", "header-dtype"])
def test_a_cached_conversion_imports_no_numpy(tmp_path: Path, tiny_gptj_dir: Path, dtype_named: bool) -> None:
    """A second `ftx convert SRC --tp 1 --weight-dtype D` decides "cached" without numpy (0.1 CPU-s of its start):
    the family tables, the plugins, the plan's estimate and the output's directory name come without it; numpy
    comes with the readers and writers of tensors. Nor filelock: a cached lookup takes no lock. A source whose
    config.json names no dtype (as the copy bound's benchmark writes it) is planned from its safetensors header's
    dtype names, without numpy either."""
    source = tmp_path / "src"
    shutil.copytree(tiny_gptj_dir, source)
    config = {k: v for k, v in json.loads((source / "config.json").read_text()).items() if k not in DTYPE_KEYS}
    (source / "config.json").write_text(json.dumps({**config, "torch_dtype": "float32"} if dtype_named else config))
    env = {**os.environ, "FTX_HOME": str(tmp_path / "home")}
    code = CONVERT_PROBE.format(source=str(source), output=str(tmp_path / "out"))
    said = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        said.append(done.stderr)
    assert "source stored as fp32" in said[0] and "convert   cached" in said[1]
    loaded = set(json.loads(done.stderr.strip().splitlines()[-1]))
    assert not {name for name in loaded if name.startswith(NOT_WHEN_CACHED)}, sorted(loaded)
