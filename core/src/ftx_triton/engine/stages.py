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
import functools
import importlib
import platform
import shutil
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

import ftx_triton
from ftx_triton.conversion import tensormap
from ftx_triton.conversion.family import Family, ModelSpec
from ftx_triton.errors import PluginError, SourceError
from ftx_triton.import_ahead import import_ahead
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
from ftx_triton.store.artifact_store import PROVENANCE_FILE, PUBLISH_IMPORTS, Artifact, ArtifactStore, make_key
from ftx_triton.terminal import timeline

if TYPE_CHECKING:
    from ftx_triton.fetching.local_keys import BackgroundKey, LocalKey, PendingKey

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
        self._pending: _PendingFetch | None = None
        """A local source being hashed beside its conversion (fetch publishes once its key is known)."""
        self._settled: dict[Path, Source] = {}
        self.before_build: Callable[[str], None] = lambda stage: None
        """Called with the stage name when a stage really builds (a cache miss), before its hook."""

    # -- the stages ------------------------------------------------------------------------

    def fetch(
        self, ref: SourceRef, family: Family | None, ctx: StageContext, *, key_with_conversion: bool = False
    ) -> Source:
        """The fetched source. ``key_with_conversion``: a local directory whose digest is not remembered is hashed
        in the background while the next stage converts it; fetch is then published by :meth:`convert`, once
        the key is known (:meth:`settled` gives the keyed Source)."""
        from ftx_triton.fetching.local_keys import LocalKey, remembered_key, settle

        if ref.kind == "local" and Path(ref.uri).is_dir():  # keyed by content, not by where it lies
            found = remembered_key(Path(ref.uri), self.store.home)
            if isinstance(found, LocalKey):
                return self._fetch_local(ref, family, ctx, found)
            if not key_with_conversion or found.keyed_before:
                return self._fetch_local(ref, family, ctx, settle(found))
            found.check_readable()
            self.before_build("fetch")
            self._local_identity[Path(ref.uri)] = found.identity
            pending = _PendingFetch(ref, family, ctx, threading.Event())
            # the converter's modules (numpy: 0.2-0.3 s on some hosts) before the hashing threads start: imported
            # beside them, they waited on the GIL (0.5 s on a 32-CPU host)
            importlib.import_module("ftx_triton.conversion.convert")
            pending.start(found, self._fetch_inputs(family, ctx, None))
            self._pending = pending
            timeline.step("fetch", cached=False, keyed="beside the conversion")
            return Source(ref=ref, path=Path(ref.uri), revision="", origin={"kind": "local", "path": ref.uri})
        from ftx_triton.fetching.refs import resolve_revision

        revision = resolve_revision(ref)
        inputs = {
            "ref": ref.uri,
            "revision": revision,
            "sha256": ref.sha256,
            "patterns": _fetch_patterns(family),
            "settings": section_fingerprint(ctx.settings.fetch),
        }
        return self._fetch_build(ref, family, ctx, revision, inputs)

    def _fetch_local(
        self, ref: SourceRef, family: Family | None, ctx: StageContext, local: LocalKey, *, timed: bool = True
    ) -> Source:
        """Fetch of a local directory keyed by ``local``: a copy elsewhere is the same artifact."""
        self._local_identity[Path(ref.uri)] = local.identity
        inputs = self._fetch_inputs(family, ctx, local.key)
        source = self._fetch_build(ref, family, ctx, local.key, inputs, timed=timed)
        if source.path != Path(ref.uri):  # built from a copy that lay elsewhere: read this one
            source = dataclasses.replace(source, ref=ref, path=Path(ref.uri), origin={**source.origin, "path": ref.uri})
        return source

    @staticmethod
    def _fetch_inputs(family: Family | None, ctx: StageContext, key: str | None) -> dict[str, Any]:
        """The fetch key's inputs for a local directory whose content key is ``key``."""
        return {
            "ref": "local",
            "revision": key,
            "patterns": _fetch_patterns(family),
            "settings": {**section_fingerprint(ctx.settings.fetch), "source": None},
        }

    def _fetch_build(
        self,
        ref: SourceRef,
        family: Family | None,
        ctx: StageContext,
        revision: str,
        inputs: dict[str, Any],
        *,
        timed: bool = True,
    ) -> Source:
        ctx = self._context(ctx)
        return self._build(
            "fetch",
            inputs,
            family,
            Source,
            ctx,
            lambda dest: self.host.hook.ftx_fetch(
                ref=ref, revision=revision, family=family or Family(), dest=dest, ctx=ctx
            ),
            timed=timed,
        )

    def settled(self, source: Source) -> Source:
        """``source`` as fetch published it, once a key computed beside the conversion is known."""
        return self._settled.get(source.path, source)

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
        pending = self._pending
        if pending is not None and Path(pending.ref.uri) == source.path:
            self._pending = None
            return self._convert_while_keying(family, source, spec, ctx, pending)
        ctx = self._context(ctx)
        inputs = self._convert_inputs(family, ctx.artifact_keys.get("adapt") or ctx.artifact_keys["fetch"], ctx)
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

    @staticmethod
    def _convert_inputs(family: Family, fetch_key: str, ctx: StageContext) -> dict[str, Any]:
        return {
            "fetch": fetch_key,
            "family": family.name,
            "fingerprint": family.fingerprint(),
            "format": tensormap.FORMAT_VERSION,
            "settings": section_fingerprint(ctx.settings.convert),
        }

    def _convert_while_keying(
        self, family: Family, source: Source, spec: ModelSpec, ctx: StageContext, pending: _PendingFetch
    ) -> Checkpoint:
        """Convert a local source while its digest is computed beside it (one pass of the CPUs instead of two),
        then publish fetch and convert under the keys that digest gives. The files must be those listed before
        both began: a change during either refuses the run and keeps nothing. When the digest shows the
        conversion in the store already (the same files under another path, or files whose times moved), the
        one in progress stops at its next tensor and the stored one is used. Nothing of the keys delays the
        conversion's start: the family's fingerprint (the source text of its table's functions) is first read by
        the digest's thread, to look the key up, and the producer record is made once the conversion is done."""
        from ftx_triton.conversion.stopping import ConversionStopped, stoppable

        ctx = self._context(ctx)
        convert_inputs = functools.partial(self._convert_inputs, family, ctx=ctx)
        pending.watch(
            lambda fetch_key: self.store.path("convert", make_key({"stage": "convert", **convert_inputs(fetch_key)}))
        )

        def build(dest: Path) -> Mapping[str, Any]:
            self.before_build("convert")
            value = self.host.hook.ftx_convert(family=family, source=source, spec=spec, dest=dest, ctx=ctx)
            return self._record("ftx_convert", Checkpoint, value, dest)

        def publish_fetch() -> str:
            local = pending.key.result()
            self._unchanged_after(source, None)
            self._settled[source.path] = self._fetch_local(pending.ref, pending.family, pending.ctx, local, timed=False)
            return self.keys["fetch"]

        def keyed() -> tuple[str, Mapping[str, Any]]:
            inputs = convert_inputs(publish_fetch())
            return make_key({"stage": "convert", **inputs}), inputs

        structlog.contextvars.bind_contextvars(stage="convert")
        try:
            with stoppable(pending.stop):
                artifact, cached = self.store.build_keyed_after(
                    "convert",
                    build,
                    keyed,
                    producer=lambda: self._producer(family, "ftx_convert", ctx),
                    force="convert" in ctx.settings.force,
                    accept=lambda hit: _result(Checkpoint, hit),
                )
        except ConversionStopped:  # the key is known and its conversion stored: the ordinary (cached) path
            fetch_key = publish_fetch()
            converted, keyed_ctx = self._settled[source.path], self._context(ctx)
            return self._build(
                "convert",
                convert_inputs(fetch_key),
                family,
                Checkpoint,
                keyed_ctx,
                lambda dest: self._unchanged_after(
                    converted,
                    self.host.hook.ftx_convert(family=family, source=converted, spec=spec, dest=dest, ctx=keyed_ctx),
                ),
            )
        except BaseException:
            pending.key.cancel()
            raise
        finally:
            structlog.contextvars.unbind_contextvars("stage")
        return self._finish("convert", artifact.key, artifact, cached, Checkpoint)

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
        *,
        timed: bool = True,
    ) -> R:
        """Build (or reuse) one stage's artifact and return the hook's typed result. ``timed=False``: the stage
        began earlier (its timeline step and :attr:`before_build` are done)."""
        key = make_key({"stage": stage, **key_inputs})
        hook_name = f"ftx_{stage}"

        def builder(tmp: Path) -> Mapping[str, Any]:
            if timed:  # else announced when the stage began (a fetch keyed beside its conversion)
                self.before_build(stage)
            return self._record(hook_name, result_type, call(tmp), tmp)

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
        return self._finish(stage, key, artifact, cached, result_type, timed=timed)

    @staticmethod
    def _record(hook_name: str, result_type: type[R], value: object, tmp: Path) -> Mapping[str, Any]:
        """The provenance of a hook's result, refused when no hook gave one or it is not ``result_type``."""
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

    def _finish(
        self, stage: str, key: str, artifact: Artifact, cached: bool, result_type: type[R], *, timed: bool = True
    ) -> R:
        """Say and log what became of a stage, and return its typed result."""
        if timed:
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


class _PendingFetch:
    """A fetch whose key is being computed in the background: what publishing it needs, and the stop signal
    of the conversion that runs meanwhile."""

    def __init__(self, ref: SourceRef, family: Family | None, ctx: StageContext, stop: threading.Event) -> None:
        self.ref, self.family, self.ctx, self.stop = ref, family, ctx, stop
        self._lock = threading.Lock()
        self._fetch_key: str | None = None
        self._stored: Callable[[str], Path] | None = None
        self.key: BackgroundKey

    def start(self, found: PendingKey, fetch_inputs: dict[str, Any]) -> None:
        """Start hashing ``found``; ``fetch_inputs``: the fetch key's inputs, its revision left to the digest."""
        from ftx_triton.fetching.local_keys import BackgroundKey

        def on_key(local: LocalKey) -> None:
            with self._lock:
                self._fetch_key = make_key({"stage": "fetch", **fetch_inputs, "revision": local.key})
            self._check()
            # the conversion still runs: what publishing it will import is imported here, not after it
            import_ahead(PUBLISH_IMPORTS)

        self.key = BackgroundKey(found, on_key)

    def watch(self, stored: Callable[[str], Path]) -> None:
        """``stored(fetch_key)``: where the conversion of that fetch would be; once it is there, stop."""
        with self._lock:
            self._stored = stored
        self._check()

    def _check(self) -> None:
        with self._lock:
            fetch_key, stored = self._fetch_key, self._stored
        if fetch_key is not None and stored is not None and (stored(fetch_key) / PROVENANCE_FILE).is_file():
            self.stop.set()


def _fetch_patterns(family: Family | None) -> list[str]:
    return list(family.fetch_patterns if family else Family.fetch_patterns)


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
