"""The one place the native runtime reads the run's settings (and its few environment variables).

Serving reads the ``launch`` section (GPUs, extra environment, hosts file, ssh port, readiness
timeout). Building on demand (when ``ftx run`` finds no build) reads ``FTX_FT_SOURCES`` (a source
directory or archive, for offline hosts), ``FTX_FT_SM`` and ``FTX_FT_JOBS``, the same choices
``ftx backend build`` takes as ``--sources``, ``--sm`` and ``--jobs``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ftx_triton.plan.settings import RunSettings
from ftx_triton.runtime.fastertransformer.options import FtLaunchOptions

if TYPE_CHECKING:
    from ftx_triton.runtime.fastertransformer.native.build import BuiltBackend
    from ftx_triton.runtime.fastertransformer.native.toolchain import Preflight
    from ftx_triton.store.artifact_store import ArtifactStore


@dataclass(frozen=True)
class NativeOptions(FtLaunchOptions):
    """The shared launch options plus what building on demand reads (``FTX_FT_SOURCES``, ``_SM``, ``_JOBS``)."""

    sources: Path | None = None
    sm: str | None = None
    jobs: int | None = None

    @classmethod
    def from_settings(cls, settings: RunSettings, environ: Mapping[str, str] | None = None) -> NativeOptions:
        environ = os.environ if environ is None else environ
        return cls(
            **cls.launch_fields(settings),
            sources=Path(environ["FTX_FT_SOURCES"]) if environ.get("FTX_FT_SOURCES") else None,
            sm=environ.get("FTX_FT_SM") or None,
            jobs=int(environ["FTX_FT_JOBS"]) if environ.get("FTX_FT_JOBS", "").isdigit() else None,
        )


def tp_pp(settings: RunSettings) -> tuple[int, int]:
    return settings.convert.planned_tp, settings.configure.pp


def backend_for(
    store: ArtifactStore,
    *,
    sm: str | None = None,
    sources: Path | None = None,
    jobs: int | None = None,
    force: bool = False,
    need_gpu: bool = True,
    say: Callable[[str], None] = lambda text: None,
    show_progress: bool = True,
    pre: Preflight | None = None,
) -> BuiltBackend:
    """The backend build for this host (``--sm`` or its GPUs): from ``store``, else built into it now.
    ``pre``: this host's preflight for ``sm`` when the caller has judged it already (probing runs nvcc,
    the compiler, cmake and MPI once more)."""
    import ftx_triton
    from ftx_triton.runtime.fastertransformer.native.build import build_backend
    from ftx_triton.runtime.fastertransformer.native.sources import acquire_sources
    from ftx_triton.runtime.fastertransformer.native.toolchain import preflight

    if pre is None:
        pre = preflight(sm, need_gpu=need_gpu)
    cache = store.home / "native" / "sources"
    return build_backend(
        store,
        pre,
        sources=lambda: acquire_sources(sources, cache, progress=show_progress),
        jobs=jobs,
        force=force,
        say=say,
        show_progress=show_progress,
        producer={"ftx": ftx_triton.__version__},
    )


__all__ = ["NativeOptions", "backend_for", "tp_pp"]
