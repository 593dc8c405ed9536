"""The stage pipeline: fetch -> convert -> tune -> configure -> serve.

Core owns the order, the runtime choice and ``--until``; :class:`ftx_triton.engine.stages.Stages` owns keys,
caching and provenance; the hooks do the work inside directories the store gives them. Nothing
here knows a runtime by name: the chosen :class:`~ftx_triton.runtime.api.Runtime` is asked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from ftx_triton.conversion.family import Family, ModelSpec
from ftx_triton.engine.sources import resolve_source
from ftx_triton.engine.stages import StageOutcome, Stages
from ftx_triton.errors import ConfigError
from ftx_triton.io.ftformat import gpu_dir_name
from ftx_triton.plan.artifacts import Checkpoint, Endpoint, GemmConfig, ModelRepository, Source, SourceRef
from ftx_triton.plan.context import StageContext
from ftx_triton.plan.resources import Estimate
from ftx_triton.plan.settings import STAGES, RunSettings
from ftx_triton.plugins import PluginHost
from ftx_triton.runtime.api import DryRunPlan, Runtime
from ftx_triton.runtime.select import choose_runtime
from ftx_triton.store.artifact_store import ArtifactStore

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
        self.estimate: Estimate | None = None  # once the model's size is known
        self.source_dtype: str | None = None
        self._license_shown: str | None = None

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
        family, hf_config = self._planned_config(ref, family)
        self._check_license(ref, family)
        if self.settings.dry_run:
            return self._dry_run(ref, family, hf_config, result)

        if family is not None and hf_config is not None:
            self._resolve_weight_dtype(family, Path(ref.uri) if ref.kind == "local" else None, hf_config)
            self._plan_resources(family, hf_config, local_source=ref.kind == "local")
        self.stages.before_build = self._before_build
        source = result.source = self.stages.fetch(ref, family)
        family, hf_config = self.host.family_for_source(source.path, family.name if family else None)
        self._check_license(ref, family)
        structlog.contextvars.bind_contextvars(family=family.name)
        self._resolve_weight_dtype(family, source.path, hf_config)
        if self.estimate is None:
            self._plan_resources(family, hf_config, local_source=True)
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

    # -- before anything is fetched -----------------------------------------------------------

    def _planned_config(self, ref: SourceRef, family: Family | None) -> tuple[Family | None, dict | None]:
        """The family and config.json known without fetching: a local directory's, or a preset's copy."""
        if ref.kind == "local" and Path(ref.uri).is_dir():
            return self.host.family_for_source(Path(ref.uri), family.name if family else None)
        if family is not None and ref.preset and ref.preset in family.presets:
            return family, dict(family.presets[ref.preset].hf_config or {}) or None
        return family, None

    def _check_license(self, ref: SourceRef, family: Family | None) -> None:
        """Show the licence once, on the terminal; refuse a non-commercial one that was not accepted."""
        from ftx_triton.fetching import licenses

        preset = family.presets.get(ref.preset) if family is not None and ref.preset else None
        license_id = (preset.license if preset else None) or (family.license if family else None)
        if not license_id or self._license_shown == license_id:
            return
        self._license_shown = license_id
        if licenses.is_noncommercial(license_id) or self.settings.dry_run:
            self.say(licenses.notice(self.settings.model, license_id))
        if not self.settings.dry_run:
            licenses.check(self.settings.model, license_id, self.settings.accept_license)
        elif licenses.is_noncommercial(license_id) and not self.settings.accept_license:
            self.say(f"          a real run needs {licenses.ACCEPT_FLAG} (or {licenses.ACCEPT_ENV}=1)")

    def _resolve_weight_dtype(self, family: Family, path: Path | None, hf_config: dict) -> None:
        """``--weight-dtype auto``: the source's own dtype (an fp16 checkpoint stays fp16)."""
        from ftx_triton.plan.resources import default_weight_dtype, source_dtype

        self.source_dtype = self.source_dtype or source_dtype(family, path, hf_config)
        if self.settings.convert.weight_dtype == "auto":
            chosen = default_weight_dtype(family, self.source_dtype)
            self.ctx.settings = self.settings.replace(weight_dtype=chosen)
            log.info("convert.weight_dtype_chosen", weight_dtype=chosen, source_dtype=self.source_dtype)

    def _estimate(self, family: Family, hf_config: dict, *, local_source: bool) -> Estimate:
        from ftx_triton.plan.resources import estimate

        runtime = self._planned_runtime()
        return estimate(
            family, family.spec(hf_config), source=self.source_dtype, weight_dtype=self.settings.convert.weight_dtype,
            compute_dtype=self.settings.configure.data_type or (runtime.default_data_type if runtime else None),
            home=self.store.home, local_source=local_source,
            loads_in_ram=bool(runtime and runtime.loads_into_host_memory and self._wanted("serve")))

    def _plan_resources(self, family: Family, hf_config: dict, *, local_source: bool) -> None:
        """Estimate sizes; refuse now if serving would not fit in memory (disk is checked per build)."""
        from ftx_triton.plan.resources import refuse

        self.estimate = self._estimate(family, hf_config, local_source=local_source)
        problems = self.estimate.problems(download=False, convert=False) if self.settings.resource_check else []
        if problems:
            raise refuse(problems, f"serving {self.settings.model}")

    def _planned_runtime(self) -> Runtime | None:
        """The runtime a run would choose (cheap; None when none can run or tuning is not reached)."""
        if not self._wanted("tune"):
            return None
        try:
            return choose_runtime(self.host.runtimes, self.settings)[0]
        except ConfigError:
            return None

    def _before_build(self, stage: str) -> None:
        """Called only when a stage really builds (not on a cache hit): disk for what it writes."""
        from ftx_triton.plan.resources import refuse

        if self.estimate is None or stage not in ("fetch", "convert"):
            return
        if stage == "fetch":
            for line in self.estimate.lines()[:2]:
                self.say(line)
        download, convert = stage == "fetch", self._wanted("convert")
        problems = self.estimate.problems(download=download, convert=convert, serve=False)
        if problems and self.settings.resource_check:
            raise refuse(problems, f"what {self.settings.model} needs")

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

    def _dry_run(self, ref: SourceRef, family: Family | None, hf_config: dict | None,
                 result: RunResult) -> RunResult:
        """Say what each stage would do, touching neither the network nor the store."""
        s = self.settings
        where = "" if ref.kind == "local" else " (download, verify, publish to the store)"
        self.say(f"fetch     {ref.display}{where}")
        if family is None or hf_config is None:
            self.say("          the next stages depend on the checkpoint's config.json: run `ftx pull` first, "
                     "or pass --family for a preset")
            return result
        self._resolve_weight_dtype(family, Path(ref.uri) if ref.kind == "local" else None, hf_config)
        s = self.settings
        result.family, result.spec = family, self._spec(family, hf_config)
        self._say_resources(family, hf_config, local_source=ref.kind == "local")
        checkpoint_dir = self.store.root / "convert" / "<key>" / gpu_dir_name(s.convert.tp)
        repository_dir = self.store.root / "configure" / "<key>"
        self.say(f"convert   {family.name} -> {checkpoint_dir} ({s.convert.weight_dtype}, tp={s.convert.tp})")
        if not self._wanted("tune"):
            return result
        given = s.configure.data_type
        runtime = self._choose_runtime(result)
        why = ("--data-type" if given else f"the {runtime.name} runtime's default" if runtime.default_data_type
               else "the weight dtype")
        self.say(f"compute   {self.settings.data_type} ({why})")
        plan = DryRunPlan(self.settings, family, result.spec, checkpoint_dir, repository_dir)
        for line in runtime.describe(plan):
            self.say(line)
        return result

    def _say_resources(self, family: Family, hf_config: dict, *, local_source: bool) -> None:
        """The size and fit lines of a dry run (a real run would refuse what does not fit)."""
        from ftx_triton.plan.resources import OVERRIDE_FLAG

        est = self._estimate(family, hf_config, local_source=local_source)
        for line in est.lines():
            self.say(line)
        problems = est.problems(download=not local_source, convert=self._wanted("convert"),
                                serve=self._wanted("serve"))
        if problems:
            self.say(f"          a real run refuses this unless it is cached or {OVERRIDE_FLAG} is given: "
                     f"{'; '.join(problems)}")


__all__ = ["Pipeline", "RunResult", "stage_index"]
