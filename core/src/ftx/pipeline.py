"""The stage pipeline: fetch -> convert -> tune -> configure -> serve.

Core owns the order, the runtime choice and ``--until``; :class:`ftx.stages.Stages` owns keys,
caching and provenance; the hooks do the work inside directories the store gives them. Nothing
here knows a runtime by name: the chosen :class:`~ftx.runtime.api.Runtime` is asked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from ftx.artifacts import Checkpoint, Endpoint, GemmConfig, ModelRepository, Source, SourceRef
from ftx.context import StageContext
from ftx.io.ftformat import gpu_dir_name
from ftx.errors import ConfigError
from ftx.family import Family, ModelSpec
from ftx.plugins import PluginHost
from ftx.runtime.api import DryRunPlan, Runtime
from ftx.runtime.select import choose_runtime
from ftx.settings import STAGES, RunSettings
from ftx.sources import resolve_source
from ftx.stages import StageOutcome, Stages
from ftx.store import ArtifactStore

log = structlog.get_logger(__name__)


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
    runtime: Runtime | None = None
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
        self.say = say or (lambda text: None)
        self.ctx = StageContext(settings=settings, store=store, home=store.home)
        self.stages = Stages(host, store, self.ctx, say=self.say)

    @property
    def settings(self) -> RunSettings:
        return self.ctx.settings

    def _wanted(self, stage: str) -> bool:
        return stage_index(stage) <= stage_index(self.settings.until)

    def run(self) -> RunResult:
        result = RunResult(outcomes=self.stages.outcomes)
        ref, preset_family = resolve_source(self.settings, self.host)
        family_name = self.settings.fetch.family or preset_family
        family = self.host.family(family_name) if family_name else None
        if self.settings.dry_run:
            return self._dry_run(ref, family, result)

        source = result.source = self.stages.fetch(ref, family)
        family, hf_config = self.host.family_for_source(source.path, family.name if family else None)
        structlog.contextvars.bind_contextvars(family=family.name)
        result.family, result.spec = family, self._spec(family, hf_config)
        if not self._wanted("convert"):
            return result
        checkpoint = result.checkpoint = self.stages.convert(family, source, result.spec)
        if not self._wanted("tune"):
            return result
        runtime = self._choose_runtime(result)
        gemm = result.gemm = self.stages.tune(family, result.spec, runtime)
        if not self._wanted("configure"):
            return result
        repository = result.repository = self.stages.configure(family, result.spec, source, checkpoint, gemm, runtime)
        if self._wanted("serve"):
            result.endpoint = self.stages.serve(repository, gemm, runtime)
        return result

    def _spec(self, family: Family, hf_config: dict) -> ModelSpec:
        s = self.settings
        spec = family.spec(hf_config)
        spec.check_parallel(s.convert.tp, s.configure.pp)
        family.check_weight_dtype(s.convert.weight_dtype)
        return spec

    def _choose_runtime(self, result: RunResult) -> Runtime:
        """Pick the runtime, resolve the compute type with its default, and say which and why."""
        runtime, reason = choose_runtime(self.host.runtimes, self.settings)
        if self.settings.configure.data_type is None:
            data_type = runtime.default_data_type or self.settings.convert.weight_dtype
            self.ctx.settings = self.settings.replace(data_type=data_type)
        self.ctx.runtime, self.ctx.runtime_reason = runtime, reason
        result.runtime, result.runtime_reason = runtime, reason
        self.say(f"runtime   {runtime.name} ({reason})")
        return runtime

    def _dry_run(self, ref: SourceRef, family: Family | None, result: RunResult) -> RunResult:
        """Say what each stage would do, touching neither the network nor the store."""
        s = self.settings
        hf_config = None
        if ref.kind == "local" and Path(ref.uri).is_dir():
            family, hf_config = self.host.family_for_source(Path(ref.uri), family.name if family else None)
        elif family is not None and ref.preset:
            hf_config = dict(family.presets[ref.preset].hf_config or {}) or None
        self.say(f"fetch     {ref.display}" + ("" if ref.kind == "local" else " (download, verify, publish to the store)"))
        if family is None or hf_config is None:
            self.say("          the next stages depend on the checkpoint's config.json: run `ftx pull` first, "
                     "or pass --family for a preset")
            return result
        result.family, result.spec = family, self._spec(family, hf_config)
        checkpoint_dir = self.store.root / "convert" / "<key>" / gpu_dir_name(s.convert.tp)
        repository_dir = self.store.root / "configure" / "<key>"
        self.say(f"convert   {family.name} -> {checkpoint_dir} ({s.convert.weight_dtype}, tp={s.convert.tp})")
        if not self._wanted("tune"):
            return result
        runtime = self._choose_runtime(result)
        plan = DryRunPlan(self.settings, family, result.spec, checkpoint_dir, repository_dir)
        for line in runtime.describe(plan):
            self.say(line)
        return result


__all__ = ["Pipeline", "RunResult", "stage_index"]
