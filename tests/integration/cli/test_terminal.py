"""What a person sees: the real ``ftx`` with stderr on a pseudo-terminal (bars drawn) and stdout
piped, as in ``D=$(ftx convert ./ckpt -o out)``; JSON only when asked, never mixed with human
lines; global flags after the subcommand; Ctrl-C as one line and exit 130."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from fetch_helpers import Entry, LocalServer, payload, tar_bytes  # noqa: E402
from terminal import FTX, run_in_terminal  # noqa: E402

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTX_")}
    return {**env, "FTX_HOME": str(home), **extra}


def _plain(text: str) -> str:
    """The text with escape sequences removed; a line erase or carriage return starts a new line."""
    return ANSI.sub("", text.replace("\x1b[2K", "\n")).replace("\r", "\n")


def test_convert_result_alone_on_stdout_while_the_bar_draws_on_the_terminal(
    tiny_gptj_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    run = run_in_terminal(["convert", str(tiny_gptj_dir), "-o", str(out)], _env(tmp_path / "home"))
    assert run.code == 0, run.terminal
    assert run.stdout == f"{out / '1-gpu'}\n"  # what D=$(ftx convert ...) captures: the path, nothing else
    screen = _plain(run.terminal)
    assert "convert gptj tp=1" in screen and "━" in screen, "the conversion bar is drawn on the terminal"
    assert "convert   done" in screen
    assert "{" not in screen, "no JSON on a terminal unless asked"
    assert not re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d", screen), "no timestamps in human lines"


def test_piped_stderr_is_human_lines_and_json_only_when_asked(tiny_gptj_dir: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    args = [FTX, "run", str(tiny_gptj_dir), "--until", "convert"]
    human = subprocess.run(args, capture_output=True, text=True, timeout=300, env=_env(home))
    assert human.returncode == 0, human.stderr
    assert human.stdout.strip().endswith("1-gpu")
    assert human.stderr.strip() and not any(line.lstrip().startswith("{") for line in human.stderr.splitlines())
    # --log-format after the subcommand, and the FTX_LOG_FORMAT twin: JSON events and nothing else
    for extra, env in (
        (["--log-format", "json", "--force", "convert"], _env(home)),
        (["--force", "convert"], _env(home, FTX_LOG_FORMAT="json")),
    ):
        piped = subprocess.run(args + extra, capture_output=True, text=True, timeout=300, env=env)
        assert piped.returncode == 0, piped.stderr
        events = [json.loads(line) for line in piped.stderr.splitlines()]  # every line is JSON
        names = {e["event"] for e in events}
        assert {"stage.finished", "message"} <= names, names
        assert any(e["event"] == "message" and e["text"].startswith("convert   done") for e in events)
        assert piped.stdout.strip().endswith("1-gpu")


def test_json_errors_are_events_too(tmp_path: Path) -> None:
    piped = subprocess.run(
        [FTX, "run", str(tmp_path / "missing"), "--log-format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(tmp_path / "home"),
    )
    assert piped.returncode == 1
    events = [json.loads(line) for line in piped.stderr.splitlines()]
    assert events[-1]["event"] == "error" and events[-1]["hint"]


def test_a_warning_prints_above_a_live_bar_as_one_human_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process: a terminal-like stderr, a live byte bar, a warning event in the middle of it."""
    import structlog
    from ftx_triton.terminal.log import configure_logging
    from ftx_triton.terminal.progress import byte_progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    configure_logging("human")
    try:
        with byte_progress("copying", 100) as bar:
            bar.advance(40)
            structlog.get_logger("test").warning("cache.corrupt", stage="convert", file="x.bin")
            bar.advance(60)
    finally:
        configure_logging("human")
    screen = _plain(tty.getvalue())
    lines = [line for line in screen.splitlines() if "cache.corrupt" in line]
    assert lines == ["warning: cache.corrupt stage=convert file=x.bin"], screen
    assert screen.rfind("copying") > screen.find("cache.corrupt"), "the bar is drawn again below the warning"


def test_ctrl_c_exits_130_with_one_line_saying_what_was_kept(tmp_path: Path) -> None:
    """An interrupted download: the partial file stays and the next run resumes it."""
    home = tmp_path / "home"
    data = tar_bytes([Entry("model/config.json", b"{}")]) + payload(4 << 20)
    with LocalServer() as server:
        server.serve_bytes("/model.tar", data, script=["stall"], stall_s=60)
        sent = threading.Event()

        def interrupt_once_bytes_arrive(_screen: str, proc: subprocess.Popen) -> None:
            parts = list((home / "downloads").rglob("*.part"))
            if not sent.is_set() and parts and parts[0].stat().st_size > 0:
                sent.set()
                os.killpg(proc.pid, signal.SIGINT)

        run = run_in_terminal(
            ["pull", server.url("/model.tar")], _env(home), timeout_s=120, on_output=interrupt_once_bytes_arrive
        )
    assert sent.is_set(), run.terminal
    assert run.code == 130, run.terminal
    screen = _plain(run.terminal)
    lines = [line for line in screen.splitlines() if "interrupted" in line]
    assert len(lines) == 1 and "model.tar.part" in lines[0] and "resumes" in lines[0], screen
    assert "Aborted" not in screen and "Traceback" not in screen
    assert run.stdout == ""


def test_ctrl_c_while_the_demo_builds_says_so_and_exits_130(tmp_path: Path) -> None:
    home = tmp_path / "home"
    sent = threading.Event()

    def interrupt_while_building(screen: str, proc: subprocess.Popen) -> None:
        if not sent.is_set() and "building the built-in tiny-gptj" in screen:
            sent.set()
            os.killpg(proc.pid, signal.SIGINT)

    run = run_in_terminal(
        ["run", "tiny-gptj", "--until", "fetch"], _env(home), timeout_s=120, on_output=interrupt_while_building
    )
    assert sent.is_set(), run.terminal
    assert run.code == 130, run.terminal
    screen = _plain(run.terminal)
    assert sum("interrupted" in line for line in screen.splitlines()) == 1, screen
    assert "Traceback" not in screen and "Aborted" not in screen
    assert not (home / "builtin" / "tiny-gptj").exists(), "nothing half-built is published"


SWALLOWED_CTRL_C = """
import os, signal, sys, weakref
from ftx_triton.cli import main
from ftx_triton.engine import builtin

real_build = builtin.build_into


class Held:
    pass


def ctrl_c_inside_a_weakref_callback(_ref):
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(1000):  # the handler runs in this loop; Python drops its KeyboardInterrupt
        pass


def build(dest, name, model):
    held = Held()
    ref = weakref.ref(held, ctrl_c_inside_a_weakref_callback)
    del held  # the callback runs now, as an import lock's does when CI's Ctrl-C landed in it
    return real_build(dest, name, model)


builtin.build_into = build
sys.argv = ["ftx", *sys.argv[1:]]
main()
"""


def test_ctrl_c_python_swallows_in_a_weakref_callback_still_interrupts_the_build(tmp_path: Path) -> None:
    """The CI flake made deterministic: the SIGINT handler runs inside a weakref callback (CI's landed in an
    import lock's), where Python swallows the KeyboardInterrupt; the build still ends as interrupted."""
    home = tmp_path / "home"
    run = subprocess.run(
        [sys.executable, "-c", SWALLOWED_CTRL_C, "run", "tiny-gptj", "--until", "fetch"],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(home),
    )
    assert run.returncode == 130, run.stderr
    assert sum("interrupted" in line for line in run.stderr.splitlines()) == 1, run.stderr
    assert "Traceback" not in run.stderr and "Exception ignored" not in run.stderr, run.stderr
    assert not (home / "builtin" / "tiny-gptj").exists(), "the interrupted build is not published"
    assert run.stdout == ""


def test_cpu_only_cuda_lines_are_not_shown_as_causes() -> None:
    from ftx_triton.server.server_log import log_tail

    text = (
        'E1123 02:00:29.132840 17765 ensemble_scheduler.cc:1468] "unable to create stream for ensemble: CUDA driver '
        'version is insufficient for CUDA runtime version"\n'
        'E1123 02:00:20.091490 17765 server.cc:241] "CudaDriverHelper has not been initialized."\n'
        "I1123 02:00:30.0 1 model_lifecycle.cc:1] \"successfully loaded 'ensemble'\"\n"
    )
    assert log_tail(text).splitlines() == [
        "I1123 02:00:30.0 1 model_lifecycle.cc:1] \"successfully loaded 'ensemble'\""
    ]


def test_waiting_on_another_process_lock_says_so(tmp_path: Path, built_demo: Path) -> None:
    """ftx says it waits for the process building the demo, then takes that process's build."""
    from fetch_helpers import demo_dir, seed_demo
    from ftx_triton.io.atomic import lock_for

    home = tmp_path / "home"
    lock = lock_for(demo_dir(home))
    lock.acquire()  # this test process plays the other ftx, building the demo
    proc = subprocess.Popen(
        [FTX, "run", "tiny-gptj", "--until", "fetch"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(home),
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "waiting for another ftx process that is building the built-in tiny-gptj model" in line, line
        assert proc.poll() is None, "it waits instead of failing"
        seed_demo(home, built_demo)  # the other ftx finishes its build
    finally:
        lock.release()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "building the built-in tiny-gptj model" not in err and out.strip()  # the other's build, not its own
