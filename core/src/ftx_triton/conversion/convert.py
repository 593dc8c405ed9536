"""Execute a family table: stream source tensors into FT files, and rebuild them back.

:func:`convert_checkpoint` reads tensors in storage order, holds a tensor only until every
row that needs it has run (a fused QKV group at most), splits each result across ranks and
writes ``<out>/<tp>-gpu/``. :func:`invert_checkpoint` reads FT files and yields the Hugging
Face tensors the table maps from.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from ftx_triton.conversion import tensormap
from ftx_triton.conversion.dtypes import numpy_dtype
from ftx_triton.conversion.family import Family, ModelSpec
from ftx_triton.conversion.layout import ft_element_count as ft_element_count  # their old home
from ftx_triton.conversion.layout import ft_layout as ft_layout
from ftx_triton.conversion.ops import OpContext
from ftx_triton.conversion.shapes import eval_shape
from ftx_triton.conversion.stopping import check_stopped
from ftx_triton.envvars import env_int
from ftx_triton.errors import CheckpointError
from ftx_triton.formats.buffers import BufferPool, as_array
from ftx_triton.formats.checkpoint import TensorReader, check_weight_dtype, read_into, tensor_dtype
from ftx_triton.formats.ftformat import gpu_dir_name, read_ini, read_tensor, write_ini
from ftx_triton.formats.writer import BackgroundWriter

log = structlog.get_logger(__name__)

Progress = Callable[[int, int], None]
"""Called with (bytes read so far, total bytes)."""


@dataclass(frozen=True)
class ConversionResult:
    """What a conversion wrote."""

    directory: Path
    files: list[str]
    bytes_read: int
    bytes_written: int
    seconds: float
    read_seconds: float = 0.0
    """Time the converter spent reading source tensors."""
    stall_seconds: float = 0.0
    """Time it waited for the writer (a measure of write-bound conversion)."""
    non_finite: tuple[str, ...] = ()
    """FT tensors written with NaN or Inf values (from the source, or past the range of the weight dtype)."""


def convert_checkpoint(
    family: Family,
    reader: TensorReader,
    hf_config: Mapping[str, Any],
    spec: ModelSpec,
    out_dir: Path,
    *,
    tp: int,
    weight_dtype: str,
    progress: Progress | None = None,
) -> ConversionResult:
    """Convert ``reader``'s tensors into ``out_dir/<tp>-gpu``; every check runs before the first write."""
    family.check_weight_dtype(weight_dtype)
    spec.check_parallel(tp, 1)
    out_dtype = numpy_dtype(weight_dtype)
    ctx = OpContext(tp=tp, out_dtype=out_dtype, dims=dict(spec.dims))
    names = reader.names()
    shapes = {n: reader.shape(n) for n in names}
    plan = tensormap.plan(family.tensor_map(spec), shapes, spec.layers, spec.dims)
    tensormap.check_tp_split(plan, tp, ctx)
    sections = family.config_ini(spec, hf_config, weight_dtype)

    waiting: dict[str, list[tensormap.Job]] = {}
    for job in plan.jobs:
        for name in job.sources:
            waiting.setdefault(name, []).append(job)
    for name in waiting:
        check_weight_dtype(name, tensor_dtype(reader, name))
    target = out_dir / gpu_dir_name(tp)
    target.mkdir(parents=True, exist_ok=True)
    held: dict[str, np.ndarray] = {}
    remaining = {id(job): len(set(job.sources)) for job in plan.jobs}
    total = sum(reader.nbytes(n) for n in waiting)
    done_bytes = 0
    files: list[str] = []
    started = time.perf_counter()
    largest = max((reader.nbytes(n) for n in waiting), default=0)
    read_seconds = 0.0
    submitted: list[tensormap.Job] = []
    pool = BufferPool(keep_bytes=max(64 << 20, largest))
    buffers = _SourceBuffers(pool, waiting)
    threads = writer_threads()
    pending = 2 * max(256 << 20, largest)  # two of the largest tensors in flight (a transpose is copied band by band)
    with BackgroundWriter(max_pending_bytes=pending, threads=threads, helpers=threads) as writer:
        random_access = getattr(reader, "read_into", None) is not None  # pread readers; archives stream in order
        for name in read_order(names, waiting, reader.nbytes) if random_access else (n for n in names if n in waiting):
            check_stopped()
            t0 = time.perf_counter()
            held[name] = buffers.read(reader, name)
            check_weight_dtype(name, held[name].dtype)  # readers that cannot tell the dtype up front
            read_seconds += time.perf_counter() - t0
            done_bytes += reader.nbytes(name)
            for job in waiting[name]:
                remaining[id(job)] -= 1
                if remaining[id(job)] == 0:
                    names_out = job.files(tp)
                    out = _run_job(job, held, buffers.context(job, ctx))
                    writer.submit(
                        [target / n for n in names_out],
                        out,
                        job.row.split,
                        label=job.dst,
                        done=functools.partial(buffers.written, job),
                    )
                    files.extend(names_out)
                    submitted.append(job)
                    for source in job.sources:
                        if all(remaining[id(j)] == 0 for j in waiting[source]):
                            held.pop(source, None)
            if progress:
                progress(done_bytes, total)
    written = writer.bytes_written
    non_finite = [job.dst for job in submitted if job.dst in writer.non_finite]
    for job in submitted:
        if bad := writer.non_finite.get(job.dst):
            log.warning(
                "convert.non_finite",
                tensor=job.dst,
                sources=list(job.sources),
                values=bad,
                note="NaN or Inf weights: the model will answer with garbage or errors",
            )
    write_ini(target / "config.ini", sections)
    files.append("config.ini")
    seconds = time.perf_counter() - started
    log.info(
        "conversion.finished",
        family=family.name,
        tp=tp,
        weight_dtype=weight_dtype,
        files=len(files),
        bytes_written=written,
        duration_s=round(seconds, 3),
        read_s=round(read_seconds, 3),
        writer_stall_s=round(writer.stall_seconds, 3),
    )
    return ConversionResult(
        target, files, done_bytes, written, seconds, read_seconds, writer.stall_seconds, tuple(non_finite)
    )


class _SourceBuffers:
    """Source tensors read into pooled buffers, each buffer given back once every job that reads its tensor has
    been written (a layout-only job's output is a view of it until then)."""

    def __init__(self, pool: BufferPool, waiting: Mapping[str, list[tensormap.Job]]) -> None:
        self._pool = pool
        self._left = {name: len({id(job) for job in jobs}) for name, jobs in waiting.items()}
        self._buffers: dict[str, np.ndarray] = {}
        self._made: dict[int, list[np.ndarray]] = {}
        self._lock = threading.Lock()

    def read(self, reader: TensorReader, name: str) -> np.ndarray:
        if getattr(reader, "read_into", None) is None:  # a reader of its own buffers (torch's mapped .bin files)
            return reader.read(name)
        buffer = self._pool.take(reader.nbytes(name))
        array = read_into(reader, name, buffer)
        if np.may_share_memory(array, buffer):
            with self._lock:
                self._buffers[name] = buffer
        else:  # a reader that reads into buffers of its own
            self._pool.give(buffer)
        return array

    def context(self, job: tensormap.Job, ctx: OpContext) -> OpContext:
        """``ctx`` for ``job``'s op: the arrays it builds come from the pool, given back with the job's sources."""

        def empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
            dtype = np.dtype(dtype)
            buffer = self._pool.take(math.prod(shape) * dtype.itemsize)
            with self._lock:
                self._made.setdefault(id(job), []).append(buffer)
            return as_array(buffer, shape, dtype)

        return dataclasses.replace(ctx, empty=empty)

    def written(self, job: tensormap.Job) -> None:
        """Called by the writer once ``job``'s files are written (or dropped)."""
        with self._lock:
            for made in self._made.pop(id(job), []):
                self._pool.give(made)
            for name in set(job.sources):
                self._left[name] -= 1
                if self._left[name] == 0 and (buffer := self._buffers.pop(name, None)) is not None:
                    self._pool.give(buffer)


def read_order(names: list[str], waiting: Mapping[str, list[tensormap.Job]], nbytes: Callable[[str], int]) -> list[str]:
    """The tensors to read, in storage order, except that the large ones that no job shares with another tensor
    (embedding and head matrices) come first. Each output file is one writer's work (split over helper threads on
    hosts of 4 or more CPUs, one thread's pass on fewer), so the largest files set the conversion's floor: started
    first, they are written beside everything else instead of after it (a head stored last was written alone at the
    end). Tensors read with others (q, k, v) keep their
    order, so none is held longer than before. Only for readers that read any tensor at its offset (``read_into``):
    a reader of archive members streams them in storage order."""
    sizes = {name: nbytes(name) for name in names if name in waiting}
    largest = max(sizes.values(), default=0)
    first: list[str] = []
    rest: list[str] = []
    for name, size in sizes.items():
        alone = all(len(set(job.sources)) == 1 for job in waiting[name])
        (first if alone and size * 2 >= largest else rest).append(name)
    return first + rest


def writer_threads() -> int | None:
    """``FTX_CONVERT_THREADS`` (1-64) overrides the number of writer threads and of the helper threads that split
    one large file (default: :func:`~ftx_triton.formats.writer.default_threads`, from the usable CPUs)."""
    return env_int("FTX_CONVERT_THREADS", None, 1, 64)


def convert_directory(
    family: Family, source: Path, out_dir: Path, *, tp: int, weight_dtype: str, progress: Progress | None = None
) -> ConversionResult:
    """Convert the checkpoint directory ``source`` (config + weights, as the family reads them)."""
    hf_config = family.read_hf_config(source)
    reader = family.open_weights(source)
    try:
        return convert_checkpoint(
            family,
            reader,
            hf_config,
            family.spec(hf_config),
            out_dir,
            tp=tp,
            weight_dtype=weight_dtype,
            progress=progress,
        )
    finally:
        reader.close()


def _run_job(job: tensormap.Job, held: Mapping[str, np.ndarray], ctx: OpContext) -> np.ndarray:
    inputs = [held[n] for n in job.sources]
    same_dtype = len({x.dtype for x in inputs}) == 1
    if not (job.row.op.layout_only and same_dtype):
        inputs = [x.astype(np.float32) for x in inputs]
    try:
        out = job.row.op.forward(inputs, ctx)
    except ValueError as exc:
        raise CheckpointError(f"cannot build {job.dst} from {', '.join(job.sources)}: {exc}") from exc
    return out.astype(ctx.out_dtype, copy=False)


def invert_checkpoint(
    family: Family, ft_dir: Path, spec: ModelSpec | None = None, *, as_stored: bool = False
) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (Hugging Face name, float32 tensor) rebuilt from a converted ``<tp>-gpu`` directory.

    ``as_stored``: tensors of layout-only rows keep the files' dtype, files are memory-mapped (copy-on-write)
    rather than read, and transposes stay views, so such a tensor is the file's pages themselves.
    """
    ini = read_ini(ft_dir / "config.ini")
    spec = spec or family.spec_from_ini(ini)
    tp = int(ft_dir.name.split("-")[0])
    weight_dtype = next((s["weight_data_type"] for s in ini.values() if "weight_data_type" in s), "fp32")
    dtype = numpy_dtype(weight_dtype)
    ctx = OpContext(tp=tp, out_dtype=np.dtype(np.float32), dims=dict(spec.dims))
    for row in family.tensor_map(spec).rows:
        if not row.invert or row.op.inverse is None:
            continue
        shapes = row.source_shapes
        if shapes is None:
            raise ValueError(f"row {row.dst!r} declares no shape, so it cannot be inverted")
        for binding in tensormap.expand(row, spec.layers):
            dst = tensormap.bind(row.dst, binding)
            src_shapes = tuple(eval_shape(s, spec.dims) for s in shapes)
            ft_shape = row.op.shape(src_shapes, ctx)
            if row.optional and not _exists(ft_dir, dst, row.split):
                continue
            array = _read_ranks(ft_dir, dst, row.split, ft_shape, tp, dtype, mmap=as_stored)
            if not as_stored or not row.op.layout_only:  # arithmetic in float32, as the conversion did it
                array = array.astype(np.float32)
            for pattern, tensor in zip(row.sources, row.op.inverse(array, ctx), strict=True):
                yield (
                    tensormap.bind(pattern.split("|")[0], binding),
                    tensor if as_stored else np.ascontiguousarray(tensor),
                )


def _exists(ft_dir: Path, dst: str, split: int | None) -> bool:
    return (ft_dir / (f"{dst}.bin" if split is None else f"{dst}.0.bin")).exists()


def _read_ranks(
    ft_dir: Path, dst: str, split: int | None, shape: tuple[int, ...], tp: int, dtype: np.dtype, *, mmap: bool = False
) -> np.ndarray:
    if split is None or tp == 1:
        return read_tensor(ft_dir / f"{dst}.{'' if split is None else '0.'}bin", dtype, shape, mmap=mmap)
    part_shape = list(shape)
    part_shape[split] //= tp
    parts = [read_tensor(ft_dir / f"{dst}.{rank}.bin", dtype, tuple(part_shape)) for rank in range(tp)]
    return np.concatenate(parts, axis=split)
