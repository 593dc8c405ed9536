"""The stage pipeline: fetch -> convert -> tune -> configure -> serve.

Core owns the order, the runtime choice and ``--until``; :class:`ftx_triton.engine.stages.Stages` owns keys,
caching and provenance; the hooks do the work inside directories the store gives them. Nothing
here knows a runtime by name: the chosen :class:`~ftx_triton.runtime.api.Runtime` is asked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from ftx_triton.conversion.family import Family, ModelSpec
from ftx_triton.engine.sources import resolve_source
from ftx_triton.engine.stages import StageOutcome, Stages
from ftx_triton.errors import ConfigError
from ftx_triton.formats.layout import gpu_dir_name
from ftx_triton.plan.artifacts import Checkpoint, Endpoint, GemmConfig, ModelRepository, Source, SourceRef
from ftx_triton.plan.context import StageContext
from ftx_triton.plan.plan import Plan
from ftx_triton.plan.resources import Estimate
from ftx_triton.plan.settings import AUTO, STAGES, RunSettings
from ftx_triton.plugins import PluginHost
from ftx_triton.runtime.api import DryRunPlan, Layout, Runtime
from ftx_triton.runtime.select import choose_runtime
from ftx_triton.store.artifact_store import ArtifactStore
from ftx_triton.terminal import timeline

if TYPE_CHECKING:
    from ftx_triton.engine.deployment import Deployment  # its HTTP client: only a run that serves imports it

log = structlog.get_logger(__name__)

NO_RUNTIME_LAYOUT = "tp 1 (no runtime is chosen for a run that stops before the tune stage)"


@dataclass
class RunResult:
    """Everything a run produced, stage by stage, and the plan it followed."""

    plan: Plan
    family: Family | None = None
    spec: ModelSpec | None = None
    source: Source | None = None
    checkpoint: Checkpoint | None = None
    gemm: GemmConfig | None = None
    repository: ModelRepository | None = None
    endpoint: Endpoint | None = None
    deployment: Deployment | None = None
    """The served model's lifecycle (OpenAI front, detach, stop), when the run served."""
    outcomes: list[StageOutcome] = field(default_factory=list)

    @property
    def runtime(self) -> Runtime | None:
        return self.plan.runtime

    @property
    def runtime_reason(self) -> str:
        return self.plan.runtime_reason


def stage_index(stage: str) -> int:
    if stage not in STAGES:
        raise ConfigError(f"unknown stage {stage!r}", hint=f"use one of: {', '.join(STAGES)}")
    return STAGES.index(stage)


class Pipeline:
    """Plans one model's run once, then runs the stages, each reading the plan."""

    def __init__(
        self, host: PluginHost, store: ArtifactStore, settings: RunSettings, *, say: Callable[[str], None] | None = None
    ) -> None:
        self.host = host
        self.store = store
        self.settings = settings
        """What the user asked for; the resolved values are the plan's (``Plan.settings``)."""
        self.say = say or (lambda text: None)
        self.stages = Stages(host, store, say=self.say)
        self.before_serve: Callable[[], None] = lambda: None
        """Called as the serve stage begins (``ftx run`` starts the OpenAI front's process then)."""
        self._estimate: Estimate | None = None  # the plan's, for the disk checks of the builds
        self._license_shown: str | None = None

    def _wanted(self, stage: str) -> bool:
        return stage_index(stage) <= stage_index(self.settings.until)

    def _context(self, plan: Plan) -> StageContext:
        return StageContext(
            settings=plan.settings,
            store=self.store,
            home=self.store.home,
            runtime=plan.runtime,
            runtime_reason=plan.runtime_reason,
            say=self.say,
        )

    def run(self) -> RunResult:
        plan = self.plan()
        timeline.step("plan")
        result = RunResult(plan=plan, outcomes=self.stages.outcomes)
        if self.settings.dry_run:
            return self._dry_run(plan, result)
        self._refuse_what_does_not_fit(plan)
        self._check_named_runtime(plan.settings)
        if plan.runtime is not None:
            self._say_runtime(plan)
        self.stages.before_build = self._before_build
        keyed_later = self._wanted("convert") and not plan.settings.fetch.adapter  # hashed beside the conversion
        source = result.source = self.stages.fetch(
            plan.ref, plan.family, self._context(plan), key_with_conversion=keyed_later
        )
        if not plan.config_is_final:
            had_runtime = plan.runtime is not None
            plan = result.plan = self._complete(plan, source)
            self._refuse_what_does_not_fit(plan)
            if not had_runtime and plan.runtime is not None:
                self._say_runtime(plan)
        family, spec = plan.family, plan.spec
        assert family is not None and spec is not None  # _complete resolves both or raises
        structlog.contextvars.bind_contextvars(family=family.name)
        result.family, result.spec = family, spec
        if not self._wanted("convert"):
            return result
        if plan.settings.fetch.adapter:
            source = result.source = self.stages.adapt(family, source, self._context(plan))
        ctx = self._context(plan)
        checkpoint = result.checkpoint = self.stages.convert(family, source, spec, ctx)
        source = result.source = self.stages.settled(source)
        if checkpoint.non_finite:
            shown = ", ".join(checkpoint.non_finite[:3]) + (" …" if len(checkpoint.non_finite) > 3 else "")
            self.say(
                f"warning: the converted weights hold NaN or Inf values in {len(checkpoint.non_finite)} "
                f"tensor(s) ({shown}); the model will answer with garbage or errors. Check the checkpoint "
                f"(or use --weight-dtype fp32 if its values overflow {checkpoint.weight_dtype})"
            )
        if not self._wanted("tune") or plan.runtime is None:
            return result
        runtime = plan.runtime
        gemm = result.gemm = self.stages.tune(family, spec, runtime, ctx)
        if not self._wanted("configure"):
            return result
        repository = result.repository = self.stages.configure(family, spec, source, checkpoint, gemm, runtime, ctx)
        if self._wanted("serve"):
            from ftx_triton.engine.deployment import Deployment  # before serving, as when this module imported it

            self.before_serve()
            endpoint = result.endpoint = self.stages.serve(repository, gemm, runtime, ctx)
            result.deployment = Deployment(endpoint, runtime, repository, plan.settings, self.store.home)
        return result

    # -- the plan ------------------------------------------------------------------------------

    def plan(self) -> Plan:
        """Everything decidable before fetching: source, family, licence and, when the model's configuration
        is known here (a local checkpoint, a preset), dtypes, parallelism, runtime and the resource estimate."""
        self._check_options()
        ref, preset_family = resolve_source(self.settings, self.host)
        family_name = self.settings.fetch.family or preset_family
        family = self.host.family(family_name) if family_name else None
        family, hf_config, final = self._planned_config(ref, family)
        self._check_license(ref, family)
        plan = Plan(self.settings, ref, family, hf_config, final)
        if family is None or hf_config is None:
            return plan
        local = ref.kind == "local"
        return self._resolve(plan, Path(ref.uri) if local else None, local_source=local)

    def _check_options(self) -> None:
        """Settings checked before anything is resolved or fetched: the runtime's name (a typo used to fail after
        fetch and convert). Option types, ranges, dtype and port names are click's; the weight dtype and tp/pp
        are checked against the model in :meth:`_resolve` when its configuration is known."""
        from ftx_triton.runtime.select import check_runtime_name

        check_runtime_name(self.host.runtimes, self.settings.runtime)

    def _check_named_runtime(self, settings: RunSettings) -> None:
        """A runtime named by --runtime that cannot serve on this machine (no GPU, fewer GPUs than tp x pp) is
        refused before anything is fetched or converted, not minutes later when it starts."""
        named = self.host.runtimes.get(settings.runtime)
        if named is None or not self._wanted("serve"):
            return
        availability = named.available(settings, self.store)
        if not availability.ok:
            raise ConfigError(
                f"the {named.name} runtime cannot serve here: {availability.reason}",
                hint="lower --tp/--pp, run on a machine that has what it needs, or choose another "
                "--runtime (`ftx run --dry-run` plans without it)",
            )

    def _complete(self, plan: Plan, source: Source) -> Plan:
        """The plan with the fetched checkpoint's own configuration (once, right after fetch)."""
        family, hf_config = self.host.family_for_source(source.path, plan.family.name if plan.family else None)
        self._check_license(plan.ref, family)
        first = replace(plan, family=family, hf_config=hf_config, config_is_final=True)
        return self._resolve(first, source.path, local_source=True)

    def _resolve(self, plan: Plan, path: Path | None, *, local_source: bool) -> Plan:
        """Resolve what depends on the model's configuration: weight dtype, tp, runtime, compute type, spec,
        estimate. What an earlier resolution decided (the runtime, the estimate) is kept."""
        from ftx_triton.plan.resources import default_weight_dtype, source_dtype, weights_for_runtime

        family, hf_config = plan.family, dict(plan.hf_config or {})
        assert family is not None
        settings = plan.settings
        dtype = plan.source_dtype or source_dtype(family, path, hf_config)
        auto_weights = settings.convert.weight_dtype == "auto"
        if auto_weights:
            settings = settings.replace(weight_dtype=default_weight_dtype(family, dtype))
        runtime, reason = plan.runtime, plan.runtime_reason
        if runtime is None and self._runtime_decides(settings, auto_weights):  # --tp auto: probe as tp 1
            probe = settings.replace(tp=1) if settings.convert.tp is AUTO else settings
            runtime, reason = choose_runtime(self.host.runtimes, probe, self.store)
        settings = self._resolve_parallelism(settings, family, hf_config, runtime)
        if runtime is not None and settings.configure.data_type is None:
            settings = settings.replace(data_type=runtime.default_data_type or settings.convert.weight_dtype)
        if auto_weights:
            chosen = weights_for_runtime(family, runtime, settings)
            settings = settings.replace(weight_dtype=chosen)
            log.info("convert.weight_dtype_chosen", weight_dtype=chosen, source_dtype=dtype)
        spec = family.spec(hf_config)
        spec.check_parallel(settings.convert.planned_tp, settings.configure.pp)
        family.check_weight_dtype(settings.convert.weight_dtype)
        estimate = plan.estimate or self._estimate_for(
            family, spec, dtype, settings, runtime, local_source=local_source
        )
        return replace(
            plan,
            settings=settings,
            spec=spec,
            source_dtype=dtype,
            runtime=runtime,
            runtime_reason=reason,
            estimate=estimate,
        )

    def _runtime_decides(self, settings: RunSettings, auto_weights: bool) -> bool:
        """Whether the plan needs a runtime: a run past convert (tune, configure and serve are the runtime's), or a
        conversion whose weight dtype (``--weight-dtype auto``) or tp (``--tp auto``) the chosen runtime decides.
        A conversion with both named (``ftx convert --tp 1 --weight-dtype fp16``) writes the same files whatever
        would serve them, so the host is not probed for one (GPUs, Docker, compilers: seconds on a GPU host)."""
        if not self._wanted("convert"):
            return False
        return self._wanted("tune") or auto_weights or settings.convert.tp is AUTO

    def _resolve_parallelism(
        self, settings: RunSettings, family: Family, hf_config: dict, runtime: Runtime | None
    ) -> RunSettings:
        """``--tp auto`` (``ftx run``'s default): tp x pp and instances as the chosen runtime lays the model out
        (``Runtime.layout``). The reason is said when the layout spreads the model and in ``--dry-run``."""
        if settings.convert.tp is not AUTO:
            return settings
        if runtime is None:
            layout = Layout(1, settings.configure.pp, settings.configure.instances, NO_RUNTIME_LAYOUT)
        else:
            layout = runtime.layout(settings, family, hf_config)
        changes = {"tp": layout.tp, "pp": layout.pp, "instances": layout.instances}
        if self.settings.dry_run or (layout.tp, layout.pp, layout.instances) != (
            1,
            settings.configure.pp,
            settings.configure.instances,
        ):
            self.say(f"place     --tp auto: {layout.reason}")
        log.info("place.chosen", **changes)
        return settings.replace(**changes)

    def _planned_config(self, ref: SourceRef, family: Family | None) -> tuple[Family | None, dict | None, bool]:
        """The family and config.json known without fetching (a local directory's, final; or a preset's copy)."""
        if ref.kind == "local" and Path(ref.uri).is_dir():
            found, config = self.host.family_for_source(Path(ref.uri), family.name if family else None)
            return found, config, True
        if family is not None and ref.preset and ref.preset in family.presets:
            return family, dict(family.presets[ref.preset].hf_config or {}) or None, False
        return family, None, False

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

    def _estimate_for(
        self,
        family: Family,
        spec: ModelSpec,
        source_dtype: str | None,
        settings: RunSettings,
        runtime: Runtime | None,
        *,
        local_source: bool,
    ) -> Estimate:
        from ftx_triton.plan.resources import estimate

        return estimate(
            family,
            spec,
            source=source_dtype,
            weight_dtype=settings.convert.weight_dtype,
            compute_dtype=settings.configure.data_type,
            home=self.store.home,
            local_source=local_source,
            loads_in_ram=bool(runtime and runtime.loads_into_host_memory and self._wanted("serve")),
        )

    def _refuse_what_does_not_fit(self, plan: Plan) -> None:
        """Refuse now if serving would not fit in memory (disk is checked per build)."""
        from ftx_triton.plan.resources import refuse

        self._estimate = plan.estimate
        if plan.estimate is None or not self.settings.resource_check:
            return
        problems = plan.estimate.problems(download=False, convert=False)
        if problems:
            raise refuse(problems, f"serving {self.settings.model}")

    def _say_runtime(self, plan: Plan) -> None:
        assert plan.runtime is not None
        self.say(f"runtime   {plan.runtime.name} ({plan.runtime_reason})")

    def _before_build(self, stage: str) -> None:
        """Called only when a stage really builds (not on a cache hit): a server started ahead of need from the last
        run's record stops (it serves what this build replaces), and this run's is not recorded; disk for what it
        writes."""
        from ftx_triton.plan.resources import refuse

        if self._wanted("serve"):  # only a run that serves has a server started ahead (one that served is recorded)
            from ftx_triton.server import head_start

            head_start.stage_builds(stage)
        if self._estimate is None or stage not in ("fetch", "convert"):
            return
        if stage == "fetch":
            for line in self._estimate.lines()[:2]:
                self.say(line)
        download, convert = stage == "fetch", self._wanted("convert")
        problems = self._estimate.problems(download=download, convert=convert, serve=False)
        if problems and self.settings.resource_check:
            raise refuse(problems, f"what {self.settings.model} needs")

    def _dry_run(self, plan: Plan, result: RunResult) -> RunResult:
        """Say what each stage would do, touching neither the network nor the store."""
        ref = plan.ref
        where = "" if ref.kind == "local" else " (download, verify, publish to the store)"
        self.say(f"fetch     {ref.display}{where}")
        family, spec = plan.family, plan.spec
        if family is None or spec is None:
            self.say(
                "          the next stages depend on the checkpoint's config.json: run `ftx pull` first, "
                "or pass --family for a preset"
            )
            return result
        s = plan.settings
        result.family, result.spec = family, spec
        self._say_resources(plan, local_source=ref.kind == "local")
        checkpoint_dir = self.store.root / "convert" / "<key>" / gpu_dir_name(s.convert.planned_tp)
        repository_dir = self.store.root / "configure" / "<key>"
        self.say(f"convert   {family.name} -> {checkpoint_dir} ({s.convert.weight_dtype}, tp={s.convert.tp})")
        runtime = plan.runtime
        if not self._wanted("tune") or runtime is None:
            return result
        self._say_runtime(plan)
        why = (
            "--data-type"
            if self.settings.configure.data_type
            else f"the {runtime.name} runtime's default"
            if runtime.default_data_type
            else "the weight dtype"
        )
        self.say(f"compute   {s.data_type} ({why})")
        for line in runtime.describe(DryRunPlan(s, family, spec, checkpoint_dir, repository_dir, self.store)):
            self.say(line)
        return result

    def _say_resources(self, plan: Plan, *, local_source: bool) -> None:
        """The size and fit lines of a dry run (a real run would refuse what does not fit)."""
        from ftx_triton.plan.resources import OVERRIDE_FLAG

        est = plan.estimate
        if est is None:
            return
        for line in est.lines():
            self.say(line)
        problems = est.problems(download=not local_source, convert=self._wanted("convert"), serve=self._wanted("serve"))
        if problems:
            self.say(
                f"          a real run refuses this unless it is cached or {OVERRIDE_FLAG} is given: "
                f"{'; '.join(problems)}"
            )


__all__ = ["Pipeline", "Plan", "RunResult", "stage_index"]
