"""The runtime base both FasterTransformer launchers (Docker, native) subclass, and their working directory.

Each launcher knows only this layer (``base``, ``options``, ``tune``, ``gpus``, ``hosts``, ``logscan``),
never the other launcher.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from ftx_triton.plan.options import OptionSection
from ftx_triton.runtime.api import Layout, Runtime
from ftx_triton.runtime.fastertransformer.options import FtLaunchSection
from ftx_triton.runtime.fastertransformer.tune import GEMM_FILE

if TYPE_CHECKING:
    from ftx_triton.conversion.family import Family
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.repository.model_config import FtModelOptions
    from ftx_triton.runtime.fastertransformer.hosts import NodeLayout


def prepare_work_dir(work_dir: Path, gemm_source: Path | None, layout: NodeLayout, hostfile_name: str) -> None:
    """tritonserver's working directory: ``gemm_config.in`` (or none, so a stale one is never read) and,
    across nodes, the mpirun hostfile."""
    work_dir.mkdir(parents=True, exist_ok=True)
    target = work_dir / GEMM_FILE
    if gemm_source is not None:
        shutil.copyfile(gemm_source, target)
    else:
        target.unlink(missing_ok=True)
    if layout.multi_node:
        (work_dir / hostfile_name).write_text(layout.hostfile_text())


class FasterTransformerRuntime(Runtime):
    """A runtime serving the ``fastertransformer`` backend: tunes GEMMs, writes the backend's model config.

    ``--runtime fastertransformer`` selects whichever subclass is available (higher ``priority`` first).
    """

    selects_as: ClassVar[tuple[str, ...]] = ("fastertransformer",)
    default_data_type: ClassVar[str | None] = "fp16"
    weights_in_compute_type: ClassVar[bool] = True
    uses_gemm_config: ClassVar[bool] = True
    answers_stream_offset: ClassVar[bool] = False
    """The backend is built with ftx's patch set, whose streamed responses say where their new tokens start."""
    option_sections: ClassVar[tuple[type[OptionSection], ...]] = (FtLaunchSection,)

    def layout(self, settings: RunSettings, family: Family, hf_config: Mapping[str, object]) -> Layout:
        """The smallest tp x pp whose weights and KV cache fit the GPUs here, instances on the rest
        (:mod:`~ftx_triton.runtime.fastertransformer.placement`)."""
        from ftx_triton.runtime.fastertransformer.placement import auto_layout

        return auto_layout(settings, family, hf_config, self)

    def write_ft_model(self, model_dir: Path, options: FtModelOptions, family: Family) -> str:
        from ftx_triton.repository.writer import write_backend_ft_model

        return write_backend_ft_model(model_dir, options, family, stream_offset=self.answers_stream_offset)

    def write_encoder_model(self, model_dir: Path, options: FtModelOptions, family: Family) -> str:
        """The backend's ``T5-Encoder`` model over the same converted files, at tp x pp = 1 only."""
        from ftx_triton.errors import ConfigError
        from ftx_triton.repository.model_config import build_encoder_model_config, write_config

        if options.tp * options.pp > 1:
            raise ConfigError(
                f"--embeddings at tp x pp = {options.tp} x {options.pp}: the encoder model would run its "
                "all-reduces on the same GPUs beside the generating model's, and two FasterTransformer models' "
                "all-reduces at once can wait on each other for ever",
                hint="serve with --tp 1 for /v1/embeddings, or leave --embeddings out",
            )
        write_config(build_encoder_model_config(options, backend="fastertransformer"), model_dir)
        return "fastertransformer"


__all__ = ["FasterTransformerRuntime", "prepare_work_dir"]
