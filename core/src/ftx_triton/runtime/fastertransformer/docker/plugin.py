"""FasterTransformer in Docker as a runtime plugin: the Triton + FT backend image, tp x pp GPUs, mpirun."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ftx_triton import hookimpl
from ftx_triton.plan.options import OptionSection
from ftx_triton.runtime.api import Availability, DryRunPlan, Runtime
from ftx_triton.runtime.fastertransformer.base import FasterTransformerRuntime
from ftx_triton.runtime.fastertransformer.docker.options import DockerOptions, DockerSection
from ftx_triton.runtime.fastertransformer.options import FtLaunchSection
from ftx_triton.runtime.fastertransformer.tune import gemm_arguments

if TYPE_CHECKING:
    from ftx_triton.conversion.family import Family, ModelSpec
    from ftx_triton.plan.artifacts import Endpoint, GemmConfig, ModelRepository
    from ftx_triton.plan.context import StageContext
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.store.artifact_store import ArtifactStore


LOCAL_SOCKET = "/var/run/docker.sock"
"""Where the docker SDK looks for the daemon without DOCKER_HOST (``docker.from_env``)."""


class DockerFasterTransformer(FasterTransformerRuntime):
    """Triton with the FasterTransformer backend in the image ``ftx image build`` makes, through Docker."""

    name = "fastertransformer-docker"
    priority = 30
    description = "Triton + FasterTransformer backend image on tp x pp GPUs through Docker (mpirun tritonserver)"
    option_sections: ClassVar[tuple[type[OptionSection], ...]] = (FtLaunchSection, DockerSection)

    def __init__(self) -> None:
        self._targets: dict[Any, dict[str, Any]] = {}

    def available(self, settings: RunSettings, store: ArtifactStore) -> Availability:
        options = DockerOptions.from_settings(settings)
        tp = settings.convert.known_tp
        if options.hosts_file and tp:
            from ftx_triton.runtime.fastertransformer.hosts import check_hosts_resolve, node_layout, read_hosts

            check_hosts_resolve(
                node_layout(
                    read_hosts(options.hosts_file),
                    tp=tp,
                    pp=settings.configure.pp,
                    instances=settings.configure.instances,
                )
            )
        if short := self._too_few_gpus(settings, options):
            return Availability(False, short)
        from importlib.util import find_spec

        if find_spec("docker") is None:
            return Availability(False, "the docker SDK is not installed")
        if not os.environ.get("DOCKER_HOST") and not Path(LOCAL_SOCKET).exists():
            return Availability(False, "no Docker daemon is reachable")  # said without importing the SDK (0.1-0.2 s)
        import docker

        try:
            client = docker.from_env(timeout=3)
            info = client.info()
        except Exception:  # noqa: BLE001 - any failure means: no usable daemon
            return Availability(False, "no Docker daemon is reachable")
        if "nvidia" not in (info.get("Runtimes") or {}):
            return Availability(False, "Docker has no NVIDIA runtime (no GPU support)")
        image = DockerOptions.from_settings(settings).image
        try:
            client.images.get(image)
        except Exception:  # noqa: BLE001
            return Availability(False, f"the image {image} is not built (run `ftx image build`)")
        return Availability(True, "Docker, the NVIDIA runtime and the FasterTransformer image are present")

    def identity(self) -> Mapping[str, str]:
        """The pinned sources the image is built from (the image id itself differs per build)."""
        from ftx_triton.runtime.fastertransformer.docker import DEFAULT_BACKEND_REF, DEFAULT_TRITON_VERSION, FT_COMMIT

        return {
            self.name: f"fastertransformer_backend@{DEFAULT_BACKEND_REF[:12]} FasterTransformer@{FT_COMMIT[:12]} "
            f"triton {DEFAULT_TRITON_VERSION}"
        }

    def describe(self, plan: DryRunPlan) -> list[str]:
        from ftx_triton.runtime.fastertransformer.docker.plan import describe_run

        return describe_run(
            plan.settings, plan.family, plan.spec, plan.checkpoint_dir, plan.repository_dir, home=plan.store.home
        )

    @staticmethod
    def _too_few_gpus(settings: RunSettings, options: DockerOptions) -> str | None:
        """Why a local Docker daemon's host cannot give tp x pp GPUs (None when it can, or cannot be known
        here: a remote daemon, a --hosts layout, no driver seen, tp still auto); checked before any fetch,
        not at the tune stage after the conversion."""
        from ftx_triton.runtime.fastertransformer.gpus import local_gpus

        wanted = (settings.convert.known_tp or 0) * settings.configure.pp
        if not wanted or options.docker_host or options.hosts_file:
            return None
        if options.gpus and len(set(options.gpus)) != wanted:
            return f"--gpus names {len(set(options.gpus))} GPU(s) but tp x pp needs {wanted}"
        found = local_gpus()
        if found and len(found) < wanted:
            return f"tp x pp needs {wanted} GPUs but this machine has {len(found)}"
        return None

    def _target(self, family: Family, spec: ModelSpec, settings: RunSettings) -> dict[str, Any]:
        """GPU, image id and tool arguments of this run's tuning (resolved once per settings)."""
        from ftx_triton.runtime.fastertransformer.docker.client import connect
        from ftx_triton.runtime.fastertransformer.docker.image import resolve_image
        from ftx_triton.runtime.fastertransformer.gpus import gpu_model, local_gpus, select_gpus

        cache_key = (family.name, repr(settings))
        if cache_key in self._targets:
            return self._targets[cache_key]
        options = DockerOptions.from_settings(settings)
        gpus = local_gpus()
        wanted = settings.convert.planned_tp * settings.configure.pp
        chosen = select_gpus(wanted, options.gpus, gpus) if not options.hosts_file else (options.gpus or (0,))
        gpu_index = chosen[0]
        model = gpu_model([g for g in gpus if g.index == gpu_index]) if gpus else "unknown GPU"
        client = connect(options.docker_host)
        target = {
            "gpu_index": gpu_index,
            "gpu_model": model,
            "image": options.image,
            "image_id": resolve_image(client, options.image),
            "args": gemm_arguments(family, spec, settings),
            "client": client,
        }
        self._targets[cache_key] = target
        return target

    def tune_key(self, family: Family, spec: ModelSpec, settings: RunSettings) -> Mapping[str, object]:
        target = self._target(family, spec, settings)
        return {"gpu": target["gpu_model"], "image_id": target["image_id"], "args": target["args"]}

    def tune(self, family: Family, spec: ModelSpec, dest: Path, ctx: StageContext) -> GemmConfig:
        from ftx_triton.plan.artifacts import GemmConfig
        from ftx_triton.runtime.fastertransformer.docker.tune import gemm_tool_path, run_tune, tune_spec

        target = self._target(family, spec, ctx.settings)
        command = [gemm_tool_path(family), *target["args"]]
        container = tune_spec(image=target["image"], command=command, work_dir=dest, gpu=target["gpu_index"])
        result = run_tune(target["client"], container, prefix=family.gemm_tool)
        (dest / "gemm-tool.log").write_text(result.output + "\n")
        (dest / "ftx-tune.json").write_text(
            json.dumps(
                {
                    "tool": family.gemm_tool,
                    "command": command,
                    "gpu": target["gpu_model"],
                    "gpu_index": target["gpu_index"],
                    "image": target["image"],
                    "image_id": target["image_id"],
                    "docker_run": container.docker_run_line(),
                },
                indent=2,
            )
        )
        reason = (
            f"{family.gemm_tool} {' '.join(target['args'])} on {target['gpu_model']} "
            f"in {target['image']} ({target['image_id'][:19]})"
        )
        return GemmConfig(result.path, True, reason)

    def serve(self, repository: ModelRepository, gemm: GemmConfig, ctx: StageContext) -> Endpoint:
        from ftx_triton.runtime.fastertransformer.docker.serve import serve_fastertransformer

        return serve_fastertransformer(repository, gemm, ctx)


@hookimpl
def ftx_register_runtimes() -> list[type[Runtime]]:
    return [DockerFasterTransformer]
