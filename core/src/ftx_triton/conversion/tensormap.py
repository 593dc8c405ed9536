"""Declarative tensor tables: Hugging Face tensors -> FasterTransformer files, and back.

A family's table is a :class:`TensorMap` of rows:

* ``M(src, dst, op, split, shape)`` — ``src`` is one name pattern or a tuple of them (a fused
  group); a pattern may list alternatives ``"lm_head.weight|shared.weight"`` (first present
  wins). ``dst`` is the FT file stem; ``split`` the axis of the FT tensor cut across ranks
  (None: one file, no rank suffix). ``shape`` declares each source's HF shape in spec dims.
* ``Skip(*patterns)`` — source tensors deliberately dropped (buffers, unused weights).

Placeholders such as ``{i}`` are bound to ``range(spec.layers["i"])``.
:func:`plan` checks coverage before any byte is written; :mod:`ftx_triton.conversion.convert` executes the plan.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ftx_triton.conversion import ops
from ftx_triton.conversion.shapes import Dim, eval_shape
from ftx_triton.errors import CheckpointError, ConfigError, MappingError

FORMAT_VERSION = 1
"""Bumped whenever the converter's output for an unchanged table changes."""

_PLACEHOLDER = re.compile(r"\{(\w+)\}")
SHOW_FIRST = 5


@dataclass(frozen=True)
class M:
    """One table row: source pattern(s) -> FT file stem, with a transform and a split axis."""

    src: str | tuple[str, ...]
    dst: str
    op: ops.Op = ops.identity
    split: int | None = None
    shape: tuple[Dim, ...] | tuple[tuple[Dim, ...], ...] | None = None
    optional: bool = False
    invert: bool = True

    @property
    def sources(self) -> tuple[str, ...]:
        return (self.src,) if isinstance(self.src, str) else tuple(self.src)

    @property
    def source_shapes(self) -> tuple[tuple[Dim, ...], ...] | None:
        if self.shape is None:
            return None
        if self.shape and isinstance(self.shape[0], tuple):
            return self.shape
        return (self.shape,) * len(self.sources)  # type: ignore[return-value]

    def placeholders(self) -> list[str]:
        names: list[str] = []
        for pattern in (*self.sources, self.dst):
            for name in _PLACEHOLDER.findall(pattern):
                if name not in names:
                    names.append(name)
        return names


@dataclass(frozen=True)
class Skip:
    """Source tensor patterns that are deliberately not converted."""

    patterns: tuple[str, ...]

    def __init__(self, *patterns: str) -> None:
        object.__setattr__(self, "patterns", patterns)


@dataclass(frozen=True)
class TensorMap:
    """An ordered table of rows and skips."""

    rows: tuple[M, ...]
    skips: tuple[str, ...] = ()

    def __init__(self, *entries: M | Skip) -> None:
        rows = tuple(e for e in entries if isinstance(e, M))
        skips = tuple(p for e in entries if isinstance(e, Skip) for p in e.patterns)
        dsts = [r.dst for r in rows]
        dupes = {d for d in dsts if dsts.count(d) > 1}
        if dupes:
            raise ValueError(f"table writes {sorted(dupes)} more than once")
        for row in rows:
            if row.op.arity != len(row.sources):
                raise ValueError(f"row {row.dst!r}: op {row.op.name} takes {row.op.arity} sources")
        object.__setattr__(self, "rows", rows)
        object.__setattr__(self, "skips", skips)

    def digest(self) -> str:
        """A stable digest of the table's content (patterns, ops, splits, shapes)."""
        text = repr([(r.sources, r.dst, r.op.name, r.split, r.shape, r.optional, r.invert) for r in self.rows])
        text += repr(self.skips) + f"format={FORMAT_VERSION}"
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Job:
    """One expanded row: concrete source names, destination stem and expected shapes."""

    row: M
    sources: tuple[str, ...]
    dst: str
    source_shapes: tuple[tuple[int, ...], ...] | None

    def files(self, tp: int) -> list[str]:
        """The FT file names this job writes for ``tp`` ranks."""
        if self.row.split is None:
            return [f"{self.dst}.bin"]
        return [f"{self.dst}.{rank}.bin" for rank in range(tp)]


@dataclass
class Plan:
    """The result of planning: jobs in table order and what was skipped."""

    jobs: list[Job]
    skipped: list[str] = field(default_factory=list)

    def files(self, tp: int) -> list[str]:
        return [name for job in self.jobs for name in job.files(tp)]


def bind(pattern: str, values: Mapping[str, int]) -> str:
    return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), pattern)


def _regex(pattern: str) -> re.Pattern[str]:
    parts = _PLACEHOLDER.split(pattern)
    out = "".join(re.escape(p) if i % 2 == 0 else r"\d+" for i, p in enumerate(parts))
    return re.compile(out + r"\Z")


def expand(row: M, layers: Mapping[str, int]) -> Iterable[dict[str, int]]:
    """Every binding of the row's placeholders over the spec's layer ranges."""
    names = row.placeholders()
    missing = [n for n in names if n not in layers]
    if missing:
        raise ValueError(f"row {row.dst!r} uses placeholders {missing} the spec does not define")
    for combo in itertools.product(*(range(layers[n]) for n in names)):
        yield dict(zip(names, combo, strict=True))


def plan(
    tmap: TensorMap, available: Mapping[str, tuple[int, ...]], layers: Mapping[str, int], dims: Mapping[str, int]
) -> Plan:
    """Match the checkpoint's tensors (name -> shape) to the table, before any write.

    Raises MappingError listing unmapped and missing tensors (first few and counts), and
    CheckpointError when a tensor's shape disagrees with the shape implied by config.json.
    """
    for name, count in layers.items():  # every layer holds a tensor: more layers than tensors cannot be, and
        if count > len(available):  # expanding the table for them would take minutes and gigabytes
            raise CheckpointError(
                f"the model config gives {count} layers ({{{name}}}), but the checkpoint holds "
                f"{len(available)} tensors in all",
                hint="config.json is corrupt or does not belong to these weights",
            )
    jobs: list[Job] = []
    consumed: set[str] = set()
    missing: list[str] = []
    for row in tmap.rows:
        for binding in expand(row, layers):
            resolved: list[str | None] = []
            for pattern in row.sources:
                alternatives = [bind(p, binding) for p in pattern.split("|")]
                resolved.append(next((a for a in alternatives if a in available), None))
            if all(r is None for r in resolved) and row.optional:
                continue
            if any(r is None for r in resolved):
                missing.extend(
                    bind(p.split("|")[0], binding) for p, r in zip(row.sources, resolved, strict=True) if r is None
                )
                continue
            names = tuple(r for r in resolved if r is not None)
            consumed.update(names)
            shapes = row.source_shapes
            expected = tuple(eval_shape(s, dims) for s in shapes) if shapes else None
            jobs.append(Job(row, names, bind(row.dst, binding), expected))
    skip_res = [_regex(p) for p in tmap.skips]
    skipped = [n for n in available if n not in consumed and any(r.match(n) for r in skip_res)]
    unmapped = [n for n in available if n not in consumed and n not in skipped]
    if unmapped or missing:
        raise MappingError(_coverage_message(unmapped, missing), hint=_coverage_hint(unmapped, missing))
    for job in jobs:
        if job.source_shapes is None:
            continue
        for name, want in zip(job.sources, job.source_shapes, strict=True):
            got = tuple(available[name])
            if got != want:
                raise CheckpointError(
                    f"tensor {name} has shape {list(got)} but config.json implies {list(want)}",
                    hint="check that config.json belongs to these weights (hidden size, heads, vocab, layers)",
                )
    return Plan(jobs, skipped)


def _first(names: Sequence[str]) -> str:
    shown = ", ".join(names[:SHOW_FIRST])
    return shown + (f", … ({len(names) - SHOW_FIRST} more)" if len(names) > SHOW_FIRST else "")


def _coverage_message(unmapped: Sequence[str], missing: Sequence[str]) -> str:
    parts = []
    if unmapped:
        parts.append(
            f"{len(unmapped)} tensor(s) in the checkpoint are not mapped by the family table: {_first(unmapped)}"
        )
    if missing:
        parts.append(f"{len(missing)} tensor(s) the family needs are missing from the checkpoint: {_first(missing)}")
    return "; ".join(parts)


def _coverage_hint(unmapped: Sequence[str], missing: Sequence[str]) -> str:
    if missing and not unmapped:
        return "the checkpoint is incomplete or has fewer layers than config.json says; re-download it"
    return "this checkpoint may belong to another family: pick one with --family (see `ftx models`)"


def check_tp_split(plan_: Plan, tp: int, ctx: ops.OpContext) -> None:
    """Every split axis must divide by tp; checked before any write."""
    for job in plan_.jobs:
        if job.row.split is None or job.source_shapes is None:
            continue
        out_shape = job.row.op.shape(job.source_shapes, ctx)
        size = out_shape[job.row.split]
        if size % tp:
            raise ConfigError(
                f"{job.dst}: axis {job.row.split} has size {size}, not divisible by --tp {tp}",
                hint="choose a --tp that divides the head count and the inner size",
            )
