"""The one typed façade every stage goes through: ``ftx run`` and every single-stage command.

Each method computes the stage's cache key in core — from the stage's frozen settings section
(every field, by construction), the keys of the artifacts it builds on and the fingerprints of the
code that shapes it — builds or reuses the artifact through the store, calls the hook (plugins
first, core's default last) and returns the hook's typed result. On a cache hit the same typed
value is rebuilt from the artifact's provenance (:func:`ftx_triton.plan.artifacts.from_record`), never from
path conventions.
"""

from __future__ import annotations

import dataclasses
import platform
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import structlog

import ftx_triton
from ftx_triton.conversion import tensormap
from ftx_triton.conversion.family import Family, ModelSpec
from ftx_triton.errors import PluginError, SourceError
from ftx_triton.plan.artifacts import (
    Checkpoint,
    Endpoint,
    GemmConfig,
    ModelRepository,
    Source,
    SourceRef,
    from_record,
    to_record,
)
from ftx_triton.plan.context import StageContext
from ftx_triton.plan.settings import RunSettings, section_fingerprint
from ftx_triton.plugins import PluginHost
from ftx_triton.runtime.api import Runtime
from ftx_triton.store.artifact_store import Artifact, ArtifactStore, make_key
from ftx_triton.terminal import timeline

log = structlog.get_logger(__name__)

R = TypeVar("R")


@dataclass(frozen=True)
class StageOutcome:
    """What happened to one stage in a run."""

    stage: str
    key: str
    path: Path | None
    cached: bool
    detail: str = ""


def tune_key_inputs(family: Family, spec: ModelSpec, runtime: Runtime, settings: RunSettings) -> dict[str, Any]:
    """What determines a gemm_config.in: the GEMM shapes, the tune settings and, when the runtime tunes,
    its target (GPU model, image or build, tool arguments)."""
    inputs: dict[str, Any] = {
        "family": family.name,
        "tool": family.gemm_tool,
        "dims": dict(spec.dims),
        "runtime": runtime.name,
        "tp": settings.convert.tp,
        "data_type": settings.data_type,
        "settings": section_fingerprint(settings.tune),
    }
    if runtime.uses_gemm_config and settings.tune.tune:
        inputs["target"] = dict(runtime.tune_key(family, spec, settings))
    return inputs


class Stages:
    """Typed calls of the stage hooks, with keys, caching and provenance owned by core."""

    def __init__(self, host: PluginHost, store: ArtifactStore, say: Callable[[str], None] | None = None) -> None:
        self.host = host
        self.store = store
        self.say = say or (lambda text: None)
        self.outcomes: list[StageOutcome] = []
        self._last_producer: dict[str, Any] = {}
        self._local_identity: dict[Path, str] = {}
        """The identity of each local source's files when they were keyed (checked again after a conversion)."""
        self.before_build: Callable[[str], None] = lambda stage: None
        """Called with the stage name when a stage really builds (a cache miss), before its hook."""

    # -- the stages ------------------------------------------------------------------------

    def fetch(self, ref: SourceRef, family: Family | None, ctx: StageContext) -> Source:
        from ftx_triton.fetching.local_keys import local_content_key
        from ftx_triton.fetching.refs import resolve_revision

        patterns = list(family.fetch_patterns if family else Family.fetch_patterns)
        settings = section_fingerprint(ctx.settings.fetch)
        local_dir = ref.kind == "local" and Path(ref.uri).is_dir()
        inputs: dict[str, Any]
        if local_dir:  # keyed by content, not by where it lies: a copy elsewhere is the same artifact
            local = local_content_key(Path(ref.uri), self.store.home)
            revision = local.key
            self._local_identity[Path(ref.uri)] = local.identity
            inputs = {
                "ref": "local",
                "revision": revision,
                "patterns": patterns,
                "settings": {**settings, "source": None},
            }
        else:
            revision = resolve_revision(ref)
            inputs = {
                "ref": ref.uri,
                "revision": revision,
                "sha256": ref.sha256,
                "patterns": patterns,
                "settings": settings,
            }
        ctx = self._context(ctx)
        source = self._build(
            "fetch",
            inputs,
            family,
            Source,
            ctx,
            lambda dest: self.host.hook.ftx_fetch(
                ref=ref, revision=revision, family=family or Family(), dest=dest, ctx=ctx
            ),
        )
        if local_dir and source.path != Path(ref.uri):  # built from a copy that lay elsewhere: read this one
            source = dataclasses.replace(source, ref=ref, path=Path(ref.uri), origin={**source.origin, "path": ref.uri})
        return source

    def adapt(self, family: Family, source: Source, ctx: StageContext) -> Source:
        """The source with the run's PEFT LoRA adapter (``--adapter``) merged into its weights: a checkpoint of
        its own, keyed by the base's key and the adapter's content (a local folder) or commit (the Hub)."""
        from ftx_triton.conversion import adapters
        from ftx_triton.fetching.local_keys import local_content_key
        from ftx_triton.fetching.refs import parse_ref, resolve_revision

        ctx = self._context(ctx)
        text = ctx.settings.fetch.adapter
        assert text is not None  # the pipeline adapts only when an adapter is given
        ref = parse_ref(text)
        local: Path | None = None
        if ref.kind == "local":
            local = Path(ref.uri)
            adapters.check_adapter_folder(local)
            revision = local_content_key(local, self.store.home).key
        elif ref.kind == "hf":
            revision = resolve_revision(ref)
        else:
            raise SourceError(
                f"--adapter {text}: an adapter is a folder or hf://org/name[@rev], not a {ref.kind} download",
                hint="download and unpack it, then pass the folder",
            )
        inputs = {
            "fetch": ctx.artifact_keys["fetch"],
            "adapter": {"ref": "local" if local else ref.uri, "revision": revision},
            "merge": adapters.MERGE_VERSION,
        }

        def merge(dest: Path) -> Source:
            folder = local if local is not None else _download_adapter(ref.uri, revision, dest.parent, ctx)
            try:
                config = adapters.check_adapter_folder(folder)
                adapters.check_adapter_fits(folder, source.path, adapters.lora_deltas(folder))
                adapters.merge_adapter(family, source.path, folder, dest)
            finally:
                if local is None:
                    shutil.rmtree(folder, ignore_errors=True)
            adapter = {"ref": ref.display, "revision": revision, **adapters.adapter_origin(config)}
            return Source(
                ref=source.ref, path=dest, revision=source.revision, origin={**source.origin, "adapter": adapter}
            )

        return self._build("adapt", inputs, family, Source, ctx, merge)

    def convert(self, family: Family, source: Source, spec: ModelSpec, ctx: StageContext) -> Checkpoint:
        ctx = self._context(ctx)
        inputs = {
            "fetch": ctx.artifact_keys.get("adapt") or ctx.artifact_keys["fetch"],
            "family": family.name,
            "fingerprint": family.fingerprint(),
            "format": tensormap.FORMAT_VERSION,
            "settings": section_fingerprint(ctx.settings.convert),
        }
        return self._build(
            "convert",
            inputs,
            family,
            Checkpoint,
            ctx,
            lambda dest: self._unchanged_after(
                source, self.host.hook.ftx_convert(family=family, source=source, spec=spec, dest=dest, ctx=ctx)
            ),
        )

    def _unchanged_after(self, source: Source, value: R) -> R:
        """``value``, built from a local source whose files are still those its key was computed from; a
        SourceError (nothing stored) when one was written, replaced, added or removed meanwhile."""
        from ftx_triton.fetching.local_keys import changed_error, source_identity

        keyed = self._local_identity.get(source.path)
        if keyed is not None and source_identity(source.path) != keyed:
            raise changed_error(source.path, "while it was converted")
        return value

    def tune(self, family: Family, spec: ModelSpec, runtime: Runtime, ctx: StageContext) -> GemmConfig:
        ctx = self._context(ctx)
        inputs = tune_key_inputs(family, spec, runtime, ctx.settings)
        return self._build(
            "tune",
            inputs,
            family,
            GemmConfig,
            ctx,
            lambda dest: self.host.hook.ftx_tune(family=family, spec=spec, dest=dest, ctx=ctx, runtime=runtime),
        )

    def configure(
        self,
        family: Family,
        spec: ModelSpec,
        source: Source,
        checkpoint: Checkpoint,
        gemm: GemmConfig,
        runtime: Runtime,
        ctx: StageContext,
    ) -> ModelRepository:
        ctx = self._context(ctx)
        keys = ctx.artifact_keys
        inputs = {
            "convert": keys["convert"],
            "tune": keys.get("tune"),
            "runtime": runtime.name,
            "ftx": ftx_triton.__version__,
            "fingerprint": family.fingerprint(),
            "settings": section_fingerprint(ctx.settings.configure),
        }
        return self._build(
            "configure",
            inputs,
            family,
            ModelRepository,
            ctx,
            lambda dest: self.host.hook.ftx_configure(
                family=family,
                spec=spec,
                source=source,
                checkpoint=checkpoint,
                gemm=gemm,
                dest=dest,
                ctx=ctx,
                runtime=runtime,
            ),
        )

    def serve(self, repository: ModelRepository, gemm: GemmConfig, runtime: Runtime, ctx: StageContext) -> Endpoint:
        ctx = self._context(ctx)
        endpoint = self.host.hook.ftx_serve(repository=repository, gemm=gemm, ctx=ctx, runtime=runtime)
        if endpoint is None:
            raise PluginError(
                f"no plugin can serve the {runtime.name} runtime",
                hint="a plugin overriding ftx_serve declined and core's default is missing",
            )
        return endpoint

    # -- machinery -------------------------------------------------------------------------

    @property
    def keys(self) -> dict[str, str]:
        """Keys of the artifacts this run has built or reused so far, by stage."""
        return {outcome.stage: outcome.key for outcome in self.outcomes}

    def _context(self, ctx: StageContext) -> StageContext:
        """The context a hook gets: the run's, with what the earlier stages produced (never written back)."""
        return replace(ctx, artifact_keys=self.keys, producer=dict(self._last_producer))

    def _build(
        self,
        stage: str,
        key_inputs: Mapping[str, Any],
        family: Family | None,
        result_type: type[R],
        ctx: StageContext,
        call: Callable[[Path], R | None],
    ) -> R:
        """Build (or reuse) one stage's artifact and return the hook's typed result."""
        key = make_key({"stage": stage, **key_inputs})
        hook_name = f"ftx_{stage}"

        def builder(tmp: Path) -> Mapping[str, Any]:
            self.before_build(stage)
            value = call(tmp)
            if value is None:
                raise PluginError(
                    f"no plugin implemented {hook_name} for this model",
                    hint="a plugin overriding this stage declined and core's default is missing",
                )
            if not isinstance(value, result_type):
                raise PluginError(
                    f"{hook_name} returned {type(value).__name__}, not {result_type.__name__}",
                    hint="a plugin's stage hook must return the documented record",
                )
            return {"result": to_record(value, tmp)}

        structlog.contextvars.bind_contextvars(stage=stage)
        try:
            artifact, cached = self.store.build(
                stage,
                key,
                builder,
                inputs=key_inputs,
                producer=self._producer(family, hook_name, ctx),
                force=stage in ctx.settings.force,
                accept=lambda hit: _result(result_type, hit),
            )
        finally:
            structlog.contextvars.unbind_contextvars("stage")
        timeline.step(stage, cached=cached)
        value = _result(result_type, artifact)
        detail = getattr(value, "reason", "") if isinstance(value, GemmConfig) and not value.tuned else ""
        if cached:
            self.store.mark_used(artifact)
            log.info("cache.hit", stage=stage, key=key, path=str(artifact.path))
            self.say(f"{stage:<9} cached   {artifact.path}")
        elif detail:
            log.info("stage.finished", stage=stage, key=key, path=str(artifact.path), skipped=detail)
            self.say(f"{stage:<9} skipped  {detail}")
        else:
            log.info(
                "stage.finished",
                stage=stage,
                key=key,
                path=str(artifact.path),
                duration_s=artifact.provenance.get("duration_s"),
            )
            self.say(f"{stage:<9} done     {artifact.path}")
        self.outcomes.append(StageOutcome(stage, key, artifact.path, cached, detail))
        self._last_producer = dict(artifact.provenance.get("producer") or {})
        return value

    def _producer(self, family: Family | None, hook_name: str, ctx: StageContext) -> dict[str, Any]:
        hook = getattr(self.host.hook, hook_name, None)  # core's own steps (adapt) have no hook
        impls = [impl.plugin_name for impl in reversed(hook.get_hookimpls())] if hook else ["ftx_triton"]
        producer: dict[str, Any] = {"ftx": ftx_triton.__version__, "python": platform.python_version(), "hook": impls}
        if family is not None:
            owner = self.host.family_owner.get(family.name)
            producer["family"] = {
                "name": family.name,
                "distribution": owner,
                "version": next((r.version for r in self.host.records if r.distribution == owner), None),
                "fingerprint": family.fingerprint(),
            }
        if ctx.runtime is not None:
            producer["runtime"] = {
                "name": ctx.runtime.name,
                "distribution": self.host.runtime_owner.get(ctx.runtime.name),
            }
        producer["plugins"] = {r.distribution: r.version for r in self.host.records if r.status == "loaded"}
        return producer


def _download_adapter(uri: str, commit: str, where: Path, ctx: StageContext) -> Path:
    """A Hub adapter's files at ``commit`` in a fresh folder under ``where`` (removed after the merge)."""
    import os
    import tempfile

    from ftx_triton.conversion.adapters import ADAPTER_PATTERNS
    from ftx_triton.fetching.hub import download_snapshot

    folder = Path(tempfile.mkdtemp(prefix="adapter-", dir=where))
    token = os.environ.get("HF_TOKEN") or None
    download_snapshot(
        uri.removeprefix("hf://"), commit, folder, ADAPTER_PATTERNS, token=token, progress=ctx.show_progress
    )
    return folder


def _result(result_type: type[R], artifact: Artifact) -> R:
    """The stage's typed result, rebuilt from the artifact's provenance."""
    return from_record(result_type, artifact.provenance.get("result") or {}, artifact.path)


__all__ = ["StageOutcome", "Stages", "tune_key_inputs"]
