"""The plan of a run: what every stage reads, decided once before the stages run.

:class:`Plan` is frozen. The pipeline builds it before fetching (from the source reference, a local
checkpoint's or a preset's ``config.json``) and, when the checkpoint's own configuration was not known
yet, completes it exactly once from the fetched files; no stage resolves the family, the licence, the
dtypes, the parallelism or the runtime again, and ``--dry-run`` prints the same plan a real run follows.

Two decisions have a reserved place, so they slot in without changing the stages:

* option validation before anything is fetched: :func:`ftx_triton.engine.pipeline.Pipeline.plan` checks the
  settings first (``_check_options``), before the source is resolved;
* ``--tp auto`` (a GPU-fit planner, a pure function of the model's shapes and the GPUs): resolved in
  ``Pipeline._resolve_parallelism``, before the spec is checked, so ``settings.convert.tp`` in the plan
  is always a number.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ftx_triton.plan.artifacts import SourceRef
from ftx_triton.plan.settings import RunSettings

if TYPE_CHECKING:
    from ftx_triton.conversion.family import Family, ModelSpec
    from ftx_triton.plan.resources import Estimate
    from ftx_triton.runtime.api import Runtime


@dataclass(frozen=True)
class Plan:
    """Everything decided about a run before (and, at most once, right after) fetching."""

    settings: RunSettings
    """The user's settings with every ``auto`` resolved that could be: weight dtype, compute type."""
    ref: SourceRef
    family: Family | None = None
    hf_config: Mapping[str, object] | None = None
    config_is_final: bool = False
    """The configuration is the checkpoint's own (a local checkpoint), not a preset's copy or unknown:
    the fetched files are not read again."""
    spec: ModelSpec | None = None
    source_dtype: str | None = None
    runtime: Runtime | None = None
    """The runtime that tunes and serves (None when the run stops before tuning)."""
    runtime_reason: str = ""
    estimate: Estimate | None = None
    """Sizes and fit (None until the model's configuration is known)."""

    @property
    def complete(self) -> bool:
        """Whether the family and the model's shapes are known (the stages after fetch can run)."""
        return self.family is not None and self.spec is not None


__all__ = ["Plan"]
