"""A Ctrl-C Python swallows (raised inside a weakref callback, a ``__del__`` or the garbage collector) is
kept and raised again at the next safe point: before a build is published, or by ``check()``."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from interrupt_helpers import ftx_interrupts_installed, swallowed  # noqa: E402


def test_a_swallowed_ctrl_c_is_raised_once_at_the_next_check() -> None:
    from ftx_triton.interrupt import check

    with ftx_interrupts_installed():
        check()  # nothing pending
        swallowed()
        with pytest.raises(KeyboardInterrupt):
            check()
        check()  # raised once


def test_other_unraisable_exceptions_still_reach_the_hook_before(monkeypatch: pytest.MonkeyPatch) -> None:
    from ftx_triton.interrupt import check

    seen: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: seen.append(unraisable.exc_type))
    with ftx_interrupts_installed():
        swallowed(ValueError("a bug in a callback"))
        check()
    assert seen == [ValueError]


def test_a_build_interrupted_by_a_swallowed_ctrl_c_is_not_published(tmp_path: Path) -> None:
    from ftx_triton.io.atomic import publish_dir

    target = tmp_path / "built"
    with ftx_interrupts_installed(), pytest.raises(KeyboardInterrupt):
        with publish_dir(target) as tmp:
            (tmp / "weights.bin").write_bytes(b"x")
            swallowed()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".built.lock"], "nothing published, no holder left"


def test_a_worker_threads_check_leaves_the_swallowed_ctrl_c_to_the_main_thread() -> None:
    from ftx_triton.interrupt import check

    raised: list[BaseException] = []

    def worker() -> None:
        try:
            check()
        except KeyboardInterrupt as exc:
            raised.append(exc)

    with ftx_interrupts_installed():
        swallowed()
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        assert raised == []
        with pytest.raises(KeyboardInterrupt):
            check()
