"""The stage pipeline: fetch -> convert -> tune -> configure -> serve.

Core owns the order, the keys, where each output lives, caching and locking; the hooks do
the work inside directories the store gives them.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

import ftx
from ftx import tensormap
from ftx.artifacts import Checkpoint, Endpoint, GemmConfig, ModelRepository, Source, SourceRef
from ftx.context import STAGES, RunSettings, StageContext
from ftx.errors import ConfigError, PluginError
from ftx.family import Family, ModelSpec
from ftx.plugins import PluginHost
from ftx.runtime.select import choose_runtime
from ftx.store import Artifact, ArtifactStore, make_key

log = structlog.get_logger(__name__)


@dataclass
class StageOutcome:
    """What happened to one stage in a run."""

    stage: str
    key: str
    path: Path | None
    cached: bool
    detail: str = ""


@dataclass
class RunResult:
    """Everything a run produced, stage by stage."""

    family: Family | None = None
    spec: ModelSpec | None = None
    source: Source | None = None
    checkpoint: Checkpoint | None = None
    gemm: GemmConfig | None = None
    repository: ModelRepository | None = None
    endpoint: Endpoint | None = None
    outcomes: list[StageOutcome] = field(default_factory=list)
    runtime: str = ""
    runtime_reason: str = ""


def stage_index(stage: str) -> int:
    if stage not in STAGES:
        raise ConfigError(f"unknown stage {stage!r}", hint=f"use one of: {', '.join(STAGES)}")
    return STAGES.index(stage)


class Pipeline:
    """Runs the stages for one model with one set of settings."""

    def __init__(self, host: PluginHost, store: ArtifactStore, settings: RunSettings,
                 *, say: Callable[[str], None] | None = None) -> None:
        self.host = host
        self.store = store
        self.settings = settings
        self.say = say or (lambda text: None)
        self.ctx = StageContext(settings=settings, store=store, home=store.home)

    # -- helpers ---------------------------------------------------------------------------

    def _producer(self, family: Family | None, hook_name: str) -> dict[str, Any]:
        hook = getattr(self.host.hook, hook_name)
        impls = [impl.plugin_name for impl in reversed(hook.get_hookimpls())]
        producer: dict[str, Any] = {"ftx": ftx.__version__, "python": platform.python_version(), "hook": impls}
        if family is not None:
            producer["family"] = {
                "name": family.name,
                "distribution": self.host.family_owner.get(family.name),
                "version": self._dist_version(family),
                "fingerprint": family.fingerprint(),
            }
        producer["plugins"] = {r.distribution: r.version for r in self.host.records if r.status == "loaded"}
        return producer

    def _dist_version(self, family: Family) -> str | None:
        owner = self.host.family_owner.get(family.name)
        return next((r.version for r in self.host.records if r.distribution == owner), None)

    def _stage(self, stage: str, key_inputs: Mapping[str, Any], family: Family | None, hook_name: str,
               call: Callable[[Path], Any], result: RunResult, hash_outputs: bool = True) -> Artifact:
        """Build (or reuse) one stage's artifact; the hook result is stored in its provenance."""
        key = make_key({"stage": stage, **key_inputs})

        def builder(tmp: Path) -> Mapping[str, Any]:
            value = call(tmp)
            if value is None:
                raise PluginError(f"no plugin implemented {hook_name} for this model",
                                  hint="a plugin overriding this stage declined and core's default is missing")
            return {"result": _describe(value, tmp, self.store.path(stage, key))}

        structlog.contextvars.bind_contextvars(stage=stage)
        try:
            artifact, cached = self.store.build(
                stage, key, builder, inputs=key_inputs, producer=self._producer(family, hook_name),
                force=stage in self.settings.force, hash_outputs=hash_outputs,
            )
        finally:
            structlog.contextvars.unbind_contextvars("stage")
        if cached:
            log.info("cache.hit", stage=stage, key=key, path=str(artifact.path))
            self.say(f"{stage:<9} cached   {artifact.path}")
        else:
            log.info("stage.finished", stage=stage, key=key, path=str(artifact.path),
                     duration_s=artifact.provenance.get("duration_s"))
            self.say(f"{stage:<9} done     {artifact.path}")
        result.outcomes.append(StageOutcome(stage, key, artifact.path, cached))
        self.ctx.artifact_keys[stage] = key
        self.ctx.producer = dict(artifact.provenance.get("producer") or {})
        return artifact

    def _wanted(self, stage: str) -> bool:
        return stage_index(stage) <= stage_index(self.settings.until)

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> RunResult:
        from ftx.default_plugins.fetch import resolve_source

        s = self.settings
        result = RunResult()
        ref, preset_family = resolve_source(s, self.host)
        family = self.host.family(s.family or preset_family) if (s.family or preset_family) else None
        if s.dry_run:
            return self._dry_run(ref, family, result)
        revision = _resolve_revision(ref)
        fetch_inputs = {"ref": ref.uri, "revision": revision,
                        "patterns": list(family.fetch_patterns if family else Family.fetch_patterns)}
        fetch_art = self._stage(
            "fetch", fetch_inputs, family, "ftx_fetch",
            lambda dest: self.host.hook.ftx_fetch(ref=ref, revision=revision, family=family or Family(),
                                                  dest=dest, ctx=self.ctx),
            result,
        )
        source = _source_from_artifact(fetch_art, ref, revision)
        result.source = source
        family, hf_config = self.host.family_for_source(source.path, family.name if family else None)
        structlog.contextvars.bind_contextvars(family=family.name)
        spec = family.spec(hf_config)
        spec.check_parallel(s.tp, s.pp)
        family.check_weight_dtype(s.weight_dtype)
        result.family, result.spec = family, spec
        if not self._wanted("convert"):
            return result

        convert_inputs = {"fetch": fetch_art.key, "family": family.name, "fingerprint": family.fingerprint(),
                          "tp": s.tp, "weight_dtype": s.weight_dtype, "format": tensormap.FORMAT_VERSION}
        ckpt_art = self._stage(
            "convert", convert_inputs, family, "ftx_convert",
            lambda dest: self.host.hook.ftx_convert(family=family, source=source, spec=spec, dest=dest, ctx=self.ctx),
            result, hash_outputs=False,
        )
        result.checkpoint = Checkpoint(ckpt_art.path / f"{s.tp}-gpu", s.tp, s.weight_dtype, family.name)
        if not self._wanted("tune"):
            return result

        runtime, reason = choose_runtime(s.runtime)
        s = self._apply_runtime(runtime, reason, result)
        from ftx.default_plugins.tune import tune_key_inputs

        gemm_art = self._stage(
            "tune", tune_key_inputs(family, spec, self.ctx), family, "ftx_tune",
            lambda dest: self.host.hook.ftx_tune(family=family, spec=spec, dest=dest, ctx=self.ctx),
            result,
        )
        result.gemm = _gemm_from_artifact(gemm_art)
        if not self._wanted("configure"):
            return result

        configure_inputs = {"convert": ckpt_art.key, "tune": gemm_art.key, "runtime": runtime, "ftx": ftx.__version__,
                            "fingerprint": family.fingerprint(), "options": _configure_options(s)}
        repo_art = self._stage(
            "configure", configure_inputs, family, "ftx_configure",
            lambda dest: self.host.hook.ftx_configure(family=family, spec=spec, source=source,
                                                      checkpoint=result.checkpoint, gemm=result.gemm, dest=dest,
                                                      ctx=self.ctx),
            result,
        )
        described = repo_art.provenance.get("result", {})
        result.repository = ModelRepository(repo_art.path, runtime, tuple(described.get("models") or ()), family.name)
        if not self._wanted("serve"):
            return result
        result.endpoint = self.host.hook.ftx_serve(repository=result.repository, gemm=result.gemm, ctx=self.ctx)
        if result.endpoint is None:
            raise PluginError(f"no plugin can serve the {runtime} runtime")
        return result

    def _apply_runtime(self, runtime: str, reason: str, result: RunResult) -> RunSettings:
        """Record the runtime; FasterTransformer on GPUs computes in fp16 unless --data-type says otherwise."""
        if self.settings.data_type is None and runtime == "fastertransformer":
            self.settings = self.settings.with_(data_type="fp16")
        self.ctx.settings = self.settings
        self.ctx.runtime, self.ctx.runtime_reason = runtime, reason
        result.runtime, result.runtime_reason = runtime, reason
        self.say(f"runtime   {runtime} ({reason})")
        return self.settings

    def _dry_run(self, ref: SourceRef, family: Family | None, result: RunResult) -> RunResult:
        """Say what each stage would do, touching neither the network nor the store."""
        s = self.settings
        hf_config: Mapping[str, Any] | None = None
        if ref.kind == "local" and Path(ref.uri).is_dir():
            family, hf_config = self.host.family_for_source(Path(ref.uri), family.name if family else None)
        elif family is not None and ref.preset:
            hf_config = family.presets[ref.preset].hf_config
        self.say(f"fetch     {ref.display}" + ("" if ref.kind == "local" else " (download, verify, publish to the store)"))
        if family is None or hf_config is None:
            self.say("          the next stages depend on the checkpoint's config.json: run `ftx pull` first, "
                     "or pass --family for a preset")
            return result
        spec = family.spec(hf_config)
        spec.check_parallel(s.tp, s.pp)
        family.check_weight_dtype(s.weight_dtype)
        result.family, result.spec = family, spec
        store = self.store.root
        checkpoint_dir = store / "convert" / "<key>" / f"{s.tp}-gpu"
        repository_dir = store / "configure" / "<key>"
        self.say(f"convert   {family.name} -> {checkpoint_dir} ({s.weight_dtype}, tp={s.tp})")
        if not self._wanted("tune"):
            return result
        runtime, reason = choose_runtime(s.runtime)
        s = self._apply_runtime(runtime, reason, result)
        if runtime == "fastertransformer":
            from ftx.docker_runtime.plan import describe_run

            for line in describe_run(s, family, spec, checkpoint_dir, repository_dir):
                self.say(line)
            return result
        self.say("tune      skipped: the python runtime does not use gemm_config.in")
        self.say(f"configure Triton repository -> {repository_dir} (fastertransformer model on the python backend, "
                 f"preprocessing, postprocessing, ensemble)")
        if self._wanted("serve"):
            self.say(f"serve     tritonserver (nvidia-pytriton) on {s.host}, ports {s.http_port or 'free'}/"
                     f"{s.grpc_port or 'free'}")
        return result


def _resolve_revision(ref: SourceRef) -> str:
    from ftx.fetching.refs import resolve_revision

    return resolve_revision(ref)


def _configure_options(s: RunSettings) -> dict[str, Any]:
    return {
        "pp": s.pp, "data_type": s.effective_data_type, "max_batch_size": s.max_batch_size,
        "instances": s.instances, "streaming": s.streaming, "dynamic_batching": s.dynamic_batching,
        "tokenizer": _tokenizer_fingerprint(s.tokenizer), "device": s.device,
    }


def _tokenizer_fingerprint(path: Path | None) -> str | None:
    """``--tokenizer`` files by content, so an edit in place makes a new repository."""
    if path is None:
        return None
    from ftx.store import sha256_file

    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return make_key({"path": str(path), "files": {str(f): sha256_file(f) for f in files}})


def _describe(value: Any, tmp: Path, final: Path) -> Any:
    """A JSON-able description of a hook result, with temp paths rewritten to the final ones."""
    if hasattr(value, "__dataclass_fields__"):
        out = {}
        for name in value.__dataclass_fields__:
            item = getattr(value, name)
            if isinstance(item, Path):
                item = str(item).replace(str(tmp), str(final))
            elif hasattr(item, "__dataclass_fields__") or isinstance(item, Mapping):
                item = _describe(item, tmp, final) if hasattr(item, "__dataclass_fields__") else dict(item)
            elif not isinstance(item, str | int | float | bool | type(None) | list | tuple):
                item = repr(item)
            out[name] = item
        return out
    return repr(value)


def _source_from_artifact(artifact: Artifact, ref: SourceRef, revision: str) -> Source:
    described = artifact.provenance.get("result", {})
    path = Path(described.get("path") or artifact.path)
    return Source(ref=ref, path=path, revision=revision, origin=described.get("origin") or {})


def _gemm_from_artifact(artifact: Artifact) -> GemmConfig:
    described = artifact.provenance.get("result", {})
    path = described.get("path")
    return GemmConfig(Path(path) if path else None, bool(described.get("tuned")), described.get("reason", ""))
