"""Click options shared by several commands, and turning them into RunSettings."""

from __future__ import annotations

import click

from ftx_triton.commandkit import AutoInt, FiniteFloatRange, options_of, section
from ftx_triton.plan.settings import ConvertSettings, RepositorySettings, RunWideSettings, SourceSettings, TuneSettings

PORT = click.IntRange(1, 65535)
"""Every TCP port option (--http-port, --grpc-port, --metrics-port, --openai-port): refused outside 1-65535."""
CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
"""The CPU build of torch (the default wheel is the CUDA build, several GB): what the kit and verify need."""


TpType = AutoInt
"""``--tp``: 1-64, or ``auto`` (:data:`~ftx_triton.plan.settings.AUTO`: the chosen runtime lays the model out)."""


source_options = options_of(SourceSettings)
"""--source, --revision, --sha256, --family: declared once on SourceSettings."""

TP_HELP = "Tensor-parallel GPUs."
conversion_options = section(
    "Conversion",
    click.option("--tp", type=click.IntRange(1, 64), default=1, show_default=True, help=TP_HELP),
    options_of(RepositorySettings, only=("pp",)),
    options_of(ConvertSettings, only=("weight_dtype",)),
)
"""--tp N, --pp, --weight-dtype: for the commands that convert or lay out at a tp the user names
(convert, configure, verify, tune, package); --tp is a number here, not the setting's auto."""

deployment_conversion_options = section(
    "Conversion",
    options_of(ConvertSettings, only=("tp",)),
    options_of(RepositorySettings, only=("pp",)),
    options_of(ConvertSettings, only=("weight_dtype",)),
)
"""The same as declared, ``--tp auto`` the default: ``ftx run`` and ``ftx lock``, which know the runtime (the
pipeline asks the chosen runtime's ``layout`` once the model's configuration is known)."""

repository_options = options_of(
    RepositorySettings,
    only=(
        "data_type",
        "max_batch_size",
        "instances",
        "text_instances",
        "text_batching",
        "text_batch_delay_us",
        "streaming",
        "stream_interval",
        "max_queue_size",
        "queue_timeout_ms",
        "batch_delay_us",
        "dynamic_batching",
        "custom_all_reduce",
        "embeddings",
        "tokenizer",
    ),
)
"""The Triton repository's settings, declared once on RepositorySettings."""

stage_options = options_of(RunWideSettings, only=("until", "runtime", "force", "dry_run"))
"""--until, --runtime, --force, --dry-run: declared once on RunWideSettings."""

tune_options = options_of(TuneSettings, only=("tune_batch", "tune_beam", "tune_max_input_len"))
"""--tune-batch, --tune-beam, --tune-max-input-len: declared once on TuneSettings."""

safety_options = options_of(RunWideSettings, only=("accept_license", "resource_check"))
"""--accept-license, --resource-check: declared once on RunWideSettings (listed under Safety)."""


__all__ = [
    "PORT",
    "FiniteFloatRange",
    "TpType",
    "conversion_options",
    "deployment_conversion_options",
    "repository_options",
    "safety_options",
    "section",
    "source_options",
    "stage_options",
    "tune_options",
]
