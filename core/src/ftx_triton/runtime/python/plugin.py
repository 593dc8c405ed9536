"""The python runtime as a plugin: the embedded tritonserver serving the converted files with transformers."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ftx_triton import hookimpl
from ftx_triton.runtime.api import Availability, DryRunPlan, Runtime

if TYPE_CHECKING:
    from ftx_triton.conversion.family import Family
    from ftx_triton.plan.artifacts import Endpoint, GemmConfig, ModelRepository
    from ftx_triton.plan.context import StageContext
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.repository.model_config import FtModelOptions
    from ftx_triton.store.artifact_store import ArtifactStore

NEEDS = {"pytriton": "nvidia-pytriton", "torch": "torch", "transformers": "transformers"}
"""Import name -> the distribution that provides it."""


def install_line(missing: list[str]) -> str:
    """The commands that install what is missing: torch and transformers through the ``torch`` extra, the
    tritonserver as :data:`~ftx_triton.server.install.TRITONSERVER_INSTALL` says (an extra cannot)."""
    from ftx_triton.server.install import TRITONSERVER_INSTALL

    steps = []
    if {"torch", "transformers"} & set(missing):
        steps.append("pip install 'ftx-triton[torch]'")
    if "nvidia-pytriton" in missing:
        steps.append(TRITONSERVER_INSTALL)
    return " && ".join(steps)


class PythonRuntime(Runtime):
    """A Python-backend ``fastertransformer`` model with FasterTransformer's inputs and outputs."""

    name = "python"
    priority = 10
    loads_into_host_memory = True  # the model is rebuilt on the CPU before it moves to a GPU
    description = "embedded tritonserver (nvidia-pytriton) + transformers on the converted files; CPU or one GPU"

    def available(self, settings: RunSettings, store: ArtifactStore) -> Availability:
        from ftx_triton.server.install import TRITONSERVER_DIR_ENV

        own_server = bool(os.environ.get(TRITONSERVER_DIR_ENV))  # a tritonserver install instead of the wheel's
        missing = [
            dist
            for module, dist in NEEDS.items()
            if not (own_server and module == "pytriton") and importlib.util.find_spec(module) is None
        ]
        if missing:
            return Availability(False, f"{', '.join(missing)} not installed ({install_line(missing)})")
        return Availability(True, "serving with the embedded python runtime")

    def describe(self, plan: DryRunPlan) -> list[str]:
        from ftx_triton.repository.writer import describe_text_models

        s = plan.settings
        lines = [
            "tune      skipped: the python runtime does not use gemm_config.in",
            f"configure Triton repository -> {plan.repository_dir} (fastertransformer model on the python "
            f"backend, {describe_text_models(s.configure)}, ensemble)",
        ]
        if s.until == "serve":
            lines.append(
                f"serve     tritonserver (nvidia-pytriton) on {s.serve.host}, ports "
                f"{s.serve.http_port or 'free'}/{s.serve.grpc_port or 'free'}"
            )
        return lines

    def write_ft_model(self, model_dir: Path, options: FtModelOptions, family: Family) -> str:
        from ftx_triton.runtime.python.repository import write_python_ft_model

        return write_python_ft_model(model_dir, options, family)

    def write_encoder_model(self, model_dir: Path, options: FtModelOptions, family: Family) -> str:
        from ftx_triton.runtime.python.repository import write_python_encoder_model

        return write_python_encoder_model(model_dir, options, family)

    def serve(self, repository: ModelRepository, gemm: GemmConfig, ctx: StageContext) -> Endpoint:
        from ftx_triton.runtime.python.serve import serve_python

        return serve_python(repository, ctx)


@hookimpl
def ftx_register_runtimes() -> list[type[Runtime]]:
    return [PythonRuntime]
