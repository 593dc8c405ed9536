"""The ``fastertransformer-native`` runtime: FasterTransformer built on this host, served by the embedded
tritonserver. ``--runtime fastertransformer`` picks it when Docker's launcher is not available."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftx_triton import hookimpl
from ftx_triton.runtime.api import Availability, DryRunPlan, Runtime
from ftx_triton.runtime.fastertransformer.base import FasterTransformerRuntime
from ftx_triton.runtime.fastertransformer.options import FtLaunchSection
from ftx_triton.runtime.fastertransformer.tune import gemm_arguments

if TYPE_CHECKING:
    from ftx_triton.conversion.family import Family, ModelSpec
    from ftx_triton.plan.artifacts import Endpoint, GemmConfig, ModelRepository
    from ftx_triton.plan.context import StageContext
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.runtime.fastertransformer.gpus import Gpu
    from ftx_triton.runtime.fastertransformer.native.build import BuiltBackend
    from ftx_triton.runtime.fastertransformer.native.toolchain import HostProbe, Preflight
    from ftx_triton.store.artifact_store import ArtifactStore


class NativeFasterTransformer(FasterTransformerRuntime):
    """Triton + the FasterTransformer backend compiled here (``ftx backend build``), no Docker."""

    name = "fastertransformer-native"
    priority = 20
    description = "FasterTransformer built on this host (ftx backend build) in the embedded tritonserver; tp x pp GPUs"
    answers_stream_offset = True

    def __init__(self) -> None:
        self._probe: HostProbe | None = None
        self._gpus: tuple[Gpu, ...] | None = None

    # -- what this host has ---------------------------------------------------------------

    def gpus(self) -> tuple[Gpu, ...]:
        """This host's GPUs: the probe's once made, else asked alone (no compiler, CUDA or MPI is asked)."""
        if self._probe is not None:
            return self._probe.gpus
        if self._gpus is None:
            from ftx_triton.runtime.fastertransformer.gpus import local_gpus

            self._gpus = tuple(local_gpus())
        return self._gpus

    def probe(self) -> HostProbe:
        from ftx_triton.runtime.fastertransformer.native.toolchain import probe_host

        if self._probe is None:
            self._probe = probe_host(gpus=self._gpus)
        return self._probe

    def preflight(self, settings: RunSettings) -> Preflight:
        from ftx_triton.runtime.fastertransformer.native.options import NativeOptions
        from ftx_triton.runtime.fastertransformer.native.toolchain import evaluate

        return evaluate(self.probe(), NativeOptions.from_settings(settings).sm)

    def available(self, settings: RunSettings, store: ArtifactStore) -> Availability:
        from ftx_triton.runtime.fastertransformer.native.build import find_backend

        hosts, tp = settings.options(FtLaunchSection).hosts, settings.convert.known_tp
        if hosts and tp:
            self.check_hosts(settings)
        gpus = self.gpus()  # a host without GPUs runs no compiler, nvcc, cmake or MPI to say so (every run plans)
        if not gpus:
            return Availability(False, "no NVIDIA GPU or driver found")
        wanted = (tp or 0) * settings.configure.pp
        if not hosts and len(gpus) < wanted:
            return Availability(False, f"tp x pp needs {wanted} GPUs but this machine has {len(gpus)}")
        pre = self.preflight(settings)
        built = find_backend(store, pre) if pre.sm else None
        if built is not None:
            return Availability(
                True, f"FasterTransformer is built here for SM {','.join(map(str, built.sm))} ({built.path})"
            )
        if pre.ok:
            return Availability(
                True,
                f"FasterTransformer is not built yet; ftx will build it for SM "
                f"{','.join(map(str, pre.sm))} from pinned sources (a few minutes, once)",
            )
        failed = pre.failures[0]
        return Availability(False, f"FasterTransformer cannot be built here: {failed.name}: {failed.detail}")

    @staticmethod
    def check_hosts(settings: RunSettings) -> None:
        """The hosts file parses, fits tp x pp, and its other machines answer on their ssh port: a
        ConfigError in seconds, before anything is fetched, instead of mpirun waiting on a dead machine."""
        from pathlib import Path

        from ftx_triton.runtime.fastertransformer.hosts import node_layout, read_hosts
        from ftx_triton.runtime.fastertransformer.native.options import NativeOptions
        from ftx_triton.runtime.fastertransformer.native.serve import check_hosts_reachable

        layout = node_layout(
            read_hosts(Path(str(settings.options(FtLaunchSection).hosts)), repeats=True),
            tp=settings.convert.planned_tp,
            pp=settings.configure.pp,
            instances=settings.configure.instances,
        )
        check_hosts_reachable(layout, NativeOptions.from_settings(settings).ssh_port)

    def built(self, ctx: StageContext) -> BuiltBackend:
        """The backend build for this host, built now if the run's store has none."""
        from ftx_triton.runtime.fastertransformer.native.options import NativeOptions, backend_for

        options = NativeOptions.from_settings(ctx.settings)
        return backend_for(
            ctx.store,
            sm=options.sm,
            sources=options.sources,
            jobs=options.jobs,
            say=ctx.say,
            show_progress=ctx.show_progress,
            pre=self.preflight(ctx.settings),  # this runtime's probe of the host: made once a run
        )

    def identity(self) -> Mapping[str, str]:
        """The pinned sources and ftx's patches the backend is built from (the build itself is per machine)."""
        from ftx_triton.runtime.fastertransformer.native.patches import patch_set_digest
        from ftx_triton.runtime.fastertransformer.pins import pins_digest

        return {self.name: f"sources {pins_digest()} patches {patch_set_digest()[:16]}"}

    # -- stages ----------------------------------------------------------------------------

    def describe(self, plan: DryRunPlan) -> list[str]:
        from ftx_triton.repository.writer import describe_text_models
        from ftx_triton.runtime.fastertransformer.native.build import backend_key, find_backend
        from ftx_triton.runtime.fastertransformer.native.options import NativeOptions

        s = plan.settings
        options = NativeOptions.from_settings(s)
        pre = self.preflight(s)
        sm = ",".join(map(str, pre.sm)) or "<--sm>"
        built = find_backend(plan.store, pre) if pre.sm else None
        build_line = (
            f"backend   cached {built.path}"
            if built
            else f"backend   ftx backend build --sm {sm}"
            + (f" --sources {options.sources}" if options.sources else "")
            + (f"  (key {backend_key(pre)})" if pre.sm else "")
        )
        lines = [build_line]
        if not pre.ok:
            lines += [f"          missing: {c.name}: {c.detail}" for c in pre.failures]
        if s.tune.tune:
            args = " ".join(gemm_arguments(plan.family, plan.spec, s))
            first = self._serving_gpus(s, options)[1][0]
            lines.append(f"tune      {plan.family.gemm_tool} {args}  (CUDA_VISIBLE_DEVICES={first})")
        else:
            lines.append("tune      skipped (--no-tune)")
        lines.append(
            f"configure Triton repository -> {plan.repository_dir} (fastertransformer backend, "
            f"{describe_text_models(s.configure)}, ensemble)"
        )
        if s.until == "serve":
            lines += self._describe_serve(plan, options, built)
        return lines

    def _serving_gpus(self, settings: RunSettings, options: Any) -> tuple[Any, tuple[int, ...]]:
        """The layout (the hosts file read and checked against tp x pp) and this machine's GPUs for it: those
        the server will take when this machine has them, else the indices it would ask for."""
        from ftx_triton.runtime.fastertransformer.gpus import select_gpus
        from ftx_triton.runtime.fastertransformer.native.serve import native_layout

        layout = native_layout(settings, options)
        here = layout.gpus_per_node * (layout.machines[0][1] if layout.multi_node else 1)
        found = self.probe().gpus
        return layout, tuple(select_gpus(here, options.gpus, found) if found else (options.gpus or range(here)))

    def _describe_serve(self, plan: DryRunPlan, options: Any, built: BuiltBackend | None) -> list[str]:
        """The serve step as it will run: the hosts file read and checked (as the Docker launcher's plan does),
        the GPUs this machine gives, the real mpirun and rank launcher of a multi-node layout."""
        import shlex

        from ftx_triton.runtime.fastertransformer.native.serve import rank_launcher, work_dir_for

        s = plan.settings
        layout, gpus = self._serving_gpus(s, options)
        work = work_dir_for(plan.store.home, s)
        mpirun = str(built.opal_prefix / "bin" / "mpirun") if built and built.opal_prefix else "mpirun"
        launcher = shlex.join(rank_launcher(layout, options, work, mpirun))
        lines = [
            f"serve     CUDA_VISIBLE_DEVICES={','.join(map(str, gpus))} {launcher + ' ' if launcher else ''}"
            f"tritonserver --model-repository={plan.repository_dir} --backend-directory=<fastertransformer + python> "
            f"(cwd {work}, holding gemm_config.in)"
        ]
        if layout.multi_node:
            lines.append(
                f"          hostfile {work / 'ftx-hostfile'}: " + "; ".join(layout.hostfile_text().splitlines())
            )
        return lines

    def tune_key(self, family: Family, spec: ModelSpec, settings: RunSettings) -> Mapping[str, object]:
        from ftx_triton.runtime.fastertransformer.gpus import gpu_model
        from ftx_triton.runtime.fastertransformer.native.build import backend_key

        pre = self.preflight(settings)
        return {
            "gpu": gpu_model(self.probe().gpus),
            "build": backend_key(pre) if pre.sm else None,
            "args": gemm_arguments(family, spec, settings),
        }

    def tune(self, family: Family, spec: ModelSpec, dest: Path, ctx: StageContext) -> GemmConfig:
        from ftx_triton.plan.artifacts import GemmConfig
        from ftx_triton.runtime.fastertransformer.gpus import gpu_model
        from ftx_triton.runtime.fastertransformer.native.options import NativeOptions
        from ftx_triton.runtime.fastertransformer.native.toolchain import gpus_for
        from ftx_triton.runtime.fastertransformer.native.tune import run_gemm_tool

        s = ctx.settings
        built = self.built(ctx)
        gpus = gpus_for(self.probe(), s.convert.planned_tp * s.configure.pp, NativeOptions.from_settings(s).gpus)
        args = gemm_arguments(family, spec, s)
        path = run_gemm_tool(built, family.gemm_tool, args, dest, gpus[0])
        model = gpu_model([g for g in self.probe().gpus if g.index == gpus[0]])
        (dest / "ftx-tune.json").write_text(
            json.dumps(
                {"tool": family.gemm_tool, "args": args, "gpu": model, "gpu_index": gpus[0], "build": built.key},
                indent=2,
            )
        )
        return GemmConfig(path, True, f"{family.gemm_tool} {' '.join(args)} on {model} (build {built.key})")

    def serve(self, repository: ModelRepository, gemm: GemmConfig, ctx: StageContext) -> Endpoint:
        from ftx_triton.runtime.fastertransformer.native.serve import serve_native

        return serve_native(repository, gemm, ctx.settings, self.built(ctx), home=ctx.home, say=ctx.say)


@hookimpl
def ftx_register_runtimes() -> list[type[Runtime]]:
    return [NativeFasterTransformer]
