"""Pure tensor transforms used in family tables, each with its shape rule and inverse.

An op maps the source tensors of one table row (Hugging Face layout) to one
FasterTransformer tensor, and back. ``layout_only`` ops move bytes without arithmetic,
so the converter may run them in the source dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported where an op runs: the family tables load without it (a cached convert)
    import numpy as np

Shape = tuple[int, ...]


def _new_array(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """``np.empty``, numpy imported on an op's first run."""
    import numpy as np

    return np.empty(shape, dtype)


@dataclass(frozen=True)
class OpContext:
    """What an op may depend on besides its inputs: the tensor-parallel size and the output dtype."""

    tp: int
    out_dtype: np.dtype
    dims: dict[str, int]
    empty: Callable[[tuple[int, ...], np.dtype], np.ndarray] = _new_array
    """Where an op that builds a new array takes its memory (the converter hands out reused buffers)."""


@dataclass(frozen=True)
class Op:
    """A named transform with its inverse (None when the row cannot be inverted)."""

    name: str
    forward: Callable[[Sequence[np.ndarray], OpContext], np.ndarray]
    shape: Callable[[Sequence[Shape], OpContext], Shape]
    inverse: Callable[[np.ndarray, OpContext], list[np.ndarray]] | None = None
    layout_only: bool = True
    arity: int = 1
    kept_rows: tuple[int | None, int | None] | None = None
    """A declared lossy step: the rows (``start``, ``stop`` of a slice) of the source tensor the FT file keeps;
    the inverse fills the others with zeros and the conformance kit's round trip compares only these. None: the
    op keeps everything (an exact inverse)."""

    @property
    def kept(self) -> slice:
        """The part of the source tensor the round trip must return exactly."""
        return slice(*self.kept_rows) if self.kept_rows is not None else slice(None)


identity = Op(
    "identity", forward=lambda xs, ctx: xs[0], shape=lambda shapes, ctx: tuple(shapes[0]), inverse=lambda y, ctx: [y]
)

transpose = Op(
    "transpose",
    forward=lambda xs, ctx: xs[0].T,
    shape=lambda shapes, ctx: tuple(reversed(shapes[0])),
    inverse=lambda y, ctx: [y.T],
)


def _fuse_qkv(xs: Sequence[np.ndarray], ctx: OpContext) -> np.ndarray:
    # three [out, in] projections -> [in, 3, out]
    import numpy as np

    dtype = np.result_type(*xs)
    stacked = np.stack(xs, axis=0, out=ctx.empty((len(xs), *xs[0].shape), dtype))
    return stacked.transpose(2, 0, 1)


def _unfuse_qkv(y: np.ndarray, ctx: OpContext) -> list[np.ndarray]:
    stacked = y.transpose(1, 2, 0)  # [3, out, in]
    return [stacked[i] for i in range(stacked.shape[0])]


fuse_qkv = Op(
    "fuse_qkv",
    forward=_fuse_qkv,
    shape=lambda shapes, ctx: (shapes[0][1], len(shapes), shapes[0][0]),
    inverse=_unfuse_qkv,
    arity=3,
)
"""Stack separate q, k, v ``[out, in]`` weights into FT's fused ``[in, 3, out]`` layout."""


def _divide_by_tp(xs: Sequence[np.ndarray], ctx: OpContext) -> np.ndarray:
    x = xs[0]
    return x / ctx.tp if ctx.tp > 1 else x


divide_by_tp = Op(
    "divide_by_tp",
    forward=_divide_by_tp,
    shape=lambda shapes, ctx: tuple(shapes[0]),
    inverse=lambda y, ctx: [y * ctx.tp if ctx.tp > 1 else y],
    layout_only=False,
)
"""A row-parallel bias added on every rank before the all-reduce: each rank holds 1/tp of it."""


def drop_rows(count: int) -> Op:
    """FasterTransformer keeps rows ``count:`` of the source table (OPT's learned position table starts with two
    offset rows FT does not read); the inverse puts zero rows back in their place. Declared lossy
    (``kept_rows``): the kit checks the kept rows exactly and the dropped ones not at all."""
    if count < 1:
        raise ValueError("drop_rows needs a count of at least 1")

    def inverse(y: np.ndarray, ctx: OpContext) -> list[np.ndarray]:
        import numpy as np

        return [np.concatenate([np.zeros((count, *y.shape[1:]), dtype=y.dtype), y])]

    return Op(
        f"drop_rows({count})",
        forward=lambda xs, ctx: xs[0][count:],
        shape=lambda shapes, ctx: (shapes[0][0] - count, *shapes[0][1:]),
        inverse=inverse,
        kept_rows=(count, None),
    )
