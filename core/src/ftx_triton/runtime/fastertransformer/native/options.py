"""The one place the native runtime reads the run's settings (and its few environment variables).

Serving reads the ``launch`` section (GPUs, extra environment, hosts file, ssh port, readiness
timeout). Building on demand (when ``ftx run`` finds no build) reads ``FTX_FT_SOURCES`` (a source
directory or archive, for offline hosts), ``FTX_FT_SM`` and ``FTX_FT_JOBS``, the same choices
``ftx backend build`` takes as ``--sources``, ``--sm`` and ``--jobs``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ftx_triton.plan.settings import RunSettings

DEFAULT_READY_TIMEOUT_S = 900.0
"""Loading a 6B-20B model onto GPUs takes minutes; a hung NCCL init must still end."""


@dataclass(frozen=True)
class NativeOptions:
    gpus: tuple[int, ...] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    hosts_file: Path | None = None
    ssh_port: int = 2222
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    sources: Path | None = None
    sm: str | None = None
    jobs: int | None = None

    @classmethod
    def from_settings(cls, settings: RunSettings, environ: Mapping[str, str] | None = None) -> NativeOptions:
        from ftx_triton.runtime.fastertransformer.options import parse_env, parse_gpus

        launch = settings.launch
        environ = os.environ if environ is None else environ
        return cls(
            gpus=parse_gpus(launch.gpus) if launch.gpus not in (None, "", ()) else None,
            env=parse_env(launch.env) if launch.env else {},
            hosts_file=Path(launch.hosts) if launch.hosts else None,
            ssh_port=int(launch.ssh_port or 2222),
            ready_timeout_s=float(launch.ready_timeout or DEFAULT_READY_TIMEOUT_S),
            sources=Path(environ["FTX_FT_SOURCES"]) if environ.get("FTX_FT_SOURCES") else None,
            sm=environ.get("FTX_FT_SM") or None,
            jobs=int(environ["FTX_FT_JOBS"]) if environ.get("FTX_FT_JOBS", "").isdigit() else None,
        )


def tp_pp(settings: RunSettings) -> tuple[int, int]:
    return settings.convert.tp, settings.configure.pp


def backend_for(*, sm: str | None = None, sources: Path | None = None, jobs: int | None = None, force: bool = False,
                need_gpu: bool = True, say: Callable[[str], None] = lambda text: None, home: Path | None = None,
                show_progress: bool = True):  # -> BuiltBackend
    """The backend build for this host (``--sm`` or its GPUs): from the store, else built now."""
    import ftx_triton
    from ftx_triton.paths import ftx_home
    from ftx_triton.runtime.fastertransformer.native.build import build_backend
    from ftx_triton.runtime.fastertransformer.native.sources import acquire_sources
    from ftx_triton.runtime.fastertransformer.native.toolchain import preflight
    from ftx_triton.store.artifact_store import ArtifactStore

    home = home or ftx_home()
    pre = preflight(sm, need_gpu=need_gpu)
    cache = home / "native" / "sources"
    return build_backend(ArtifactStore(home), pre, sources=lambda: acquire_sources(sources, cache, progress=show_progress),
                         jobs=jobs, force=force, say=say, show_progress=show_progress,
                         producer={"ftx": ftx_triton.__version__})


__all__ = ["NativeOptions", "backend_for", "tp_pp"]
