"""A background writer: materialise, split, check and write FT files while the next tensors are read.

Bounded: the arrays waiting for the writer hold at most ``max_pending_bytes``, so memory stays near the size of a
few tensors whatever the model size (a strided array, a transpose, is copied a band of a few MiB at a time as it is
written, never whole). Errors surface on the next submit or at close. Each file is written in one pass over its bytes
that also hashes them (the store's chunked digest) and, for a labelled submission, counts its NaN and Inf values, in
the writer's threads, on the bytes it writes. On a host of several cores a large file's copies, writes, chunk
digests and count are also split over a pool of helper threads
(:func:`~ftx_triton.formats.ftformat.write_tensor_counted`), so one 400 MB tensor does not keep a single core busy
while the others wait.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

import numpy as np

from ftx_triton.formats.ftformat import write_tensor_counted
from ftx_triton.io.cores import usable_cpus

MAX_WRITERS = 8
"""Writer threads at most by default: more tensors in flight would only hold more memory (the pending bytes
bound them), while each large one is split over the helper threads anyway."""
MAX_HELPERS = 32


def default_threads() -> tuple[int, int]:
    """(writer threads, helper threads that split one large file) for this host: one writer per usable CPU up to
    :data:`MAX_WRITERS`; helpers only where there are 4 or more CPUs (on fewer, the writers keep every core busy
    already and splitting would add work, not speed)."""
    cpus = usable_cpus()
    return min(MAX_WRITERS, cpus), (min(MAX_HELPERS, cpus) if cpus >= 4 else 0)


_Item = tuple[list[Path], np.ndarray, int | None, str | None, Callable[[], None] | None, int]


class BackgroundWriter:
    """``submit(path, array)`` returns at once unless too much is pending; ``close()`` waits for all."""

    def __init__(
        self, max_pending_bytes: int = 1 << 30, threads: int | None = None, helpers: int | None = None
    ) -> None:
        """``threads``: writer threads; ``helpers``: threads that split one large file's copies and writes (0 or 1:
        none); each defaults to :func:`default_threads`."""
        self._queue: queue.Queue[_Item | None] = queue.Queue()
        self._pending = 0
        self._limit = max_pending_bytes
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._abandoned = False
        self.bytes_written = 0
        self.stall_seconds = 0.0
        self.non_finite: dict[str, int] = {}
        """NaN and Inf values found, by the label of the submission that held them (only those with some)."""
        default_writers, default_helpers = default_threads()
        count = default_writers if threads is None else threads
        if count < 1:  # no thread would write, and every submitted tensor would be silently dropped
            raise ValueError(f"a writer needs at least one thread, not {count}")
        helpers = default_helpers if helpers is None else helpers
        self._helpers: Executor | None = (
            ThreadPoolExecutor(max_workers=helpers, thread_name_prefix="ftx-split") if helpers > 1 else None
        )
        self._threads = [threading.Thread(target=self._run, name=f"ftx-writer-{i}", daemon=True) for i in range(count)]
        for thread in self._threads:
            thread.start()

    def submit(
        self,
        paths: list[Path],
        array: np.ndarray,
        split: int | None = None,
        label: str | None = None,
        done: Callable[[], None] | None = None,
    ) -> None:
        """Write ``array`` to ``paths[0]``, or split along ``split`` into ``len(paths)`` files; with a ``label``,
        count its NaN and Inf values into :attr:`non_finite` under it. ``done()`` is called (in a writer
        thread) once the writer holds no view of ``array`` any more: written, failed or dropped."""
        cost = array.nbytes
        with self._cond:
            # One array larger than the limit may still go when nothing else is pending.
            started = time.perf_counter()
            self._cond.wait_for(lambda: self._error or self._pending == 0 or self._pending + cost <= self._limit)
            self.stall_seconds += time.perf_counter() - started
            self._raise_if_failed()
            self._pending += cost
        self._queue.put((paths, array, split, label, done, cost))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            paths, array, split, label, done, nbytes = item
            try:
                if self._error is None and not self._abandoned:
                    self._write(paths, array, split, label)
            except BaseException as exc:  # handed to the submitting thread
                self._error = exc
            del item, array  # the views of it die with _write's frame: none is left when done() hands it back
            if done is not None:
                try:
                    done()
                except BaseException as exc:  # handed to the submitting thread
                    self._error = self._error or exc
            with self._cond:
                self._pending -= nbytes
                self._cond.notify_all()

    def _write(self, paths: list[Path], array: np.ndarray, split: int | None, label: str | None) -> None:
        written = bad = 0
        parts = [array] if split is None else np.split(array, len(paths), axis=split)
        for path, part in zip(paths, parts, strict=True):
            size, found = write_tensor_counted(path, part, count_non_finite=label is not None, workers=self._helpers)
            written, bad = written + size, bad + found
        with self._cond:
            self.bytes_written += written
            if bad and label is not None:
                self.non_finite[label] = self.non_finite.get(label, 0) + bad

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _stop(self) -> None:
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join()
        if self._helpers is not None:
            self._helpers.shutdown()

    def close(self) -> None:
        self._stop()
        self._raise_if_failed()

    def __enter__(self) -> BackgroundWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        else:  # stop quietly, dropping what waits to be written; the original exception wins
            self._abandoned = True
            self._stop()
