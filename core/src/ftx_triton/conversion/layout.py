"""The FT tensors a family's table writes for a model, from shapes alone: no weights and no numpy (a plan's
estimate counts them on every run, cached or not)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, cast

from ftx_triton.conversion import tensormap
from ftx_triton.conversion.ops import OpContext
from ftx_triton.conversion.shapes import eval_shape

if TYPE_CHECKING:
    import numpy as np

    from ftx_triton.conversion.family import Family, ModelSpec

_SHAPES_ONLY = cast("np.dtype", "float32")
"""The context's output dtype for shape rules, which read only ``tp`` and ``dims`` (a name, not numpy's dtype)."""


def shaped_rows(family: Family, spec: ModelSpec) -> Iterator[tuple[tensormap.M, tuple[int, ...]]]:
    """Each table row with source shapes, and the full shape of the FT tensor it writes (one layer's)."""
    ctx = OpContext(tp=1, out_dtype=_SHAPES_ONLY, dims=dict(spec.dims))
    for row in family.tensor_map(spec).rows:
        if row.source_shapes is not None:
            yield row, row.op.shape(tuple(eval_shape(s, spec.dims) for s in row.source_shapes), ctx)


def ft_layout(family: Family, spec: ModelSpec) -> dict[str, tuple[tuple[int, ...], int | None]]:
    """Every FT tensor the table writes for ``spec``: file stem -> (full shape, split axis)."""
    return {
        tensormap.bind(row.dst, binding): (shape, row.split)
        for row, shape in shaped_rows(family, spec)
        for binding in tensormap.expand(row, spec.layers)
    }


def ft_element_count(family: Family, spec: ModelSpec) -> int:
    """Elements of every FT tensor the table writes for ``spec``: each row's shape times its layer bindings,
    without expanding the table (a config claiming a billion layers costs nothing here)."""
    per_row = {
        row.dst: math.prod(shape) * math.prod(spec.layers[name] for name in row.placeholders())
        for row, shape in shaped_rows(family, spec)
    }
    return sum(per_row.values())
