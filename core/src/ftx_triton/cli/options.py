"""Click options shared by several commands, and turning them into RunSettings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ftx_triton.commandkit import FiniteFloatRange, options_of, section
from ftx_triton.conversion.dtype_names import WEIGHT_DTYPE_NAMES
from ftx_triton.plan.settings import AUTO, STAGES, SourceSettings, TuneSettings

PORT = click.IntRange(1, 65535)
"""Every TCP port option (--http-port, --grpc-port, --metrics-port, --openai-port): refused outside 1-65535."""


class TpType(click.IntRange):
    """``--tp``: 1-64, or ``auto`` (:data:`~ftx_triton.plan.settings.AUTO`: the chosen runtime lays the model out)."""

    name = "1-64|auto"

    def __init__(self) -> None:
        super().__init__(1, 64)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is AUTO or (isinstance(value, str) and value.strip().lower() == "auto"):
            return AUTO
        return super().convert(value, param, ctx)


DATA_TYPE_HELP = (
    "Compute type (default: the runtime's own — fp16 on the fastertransformer runtime — else the "
    "weight dtype; the python runtime computes fp16 as fp32 on a CPU; --dry-run shows the choice)."
)

source_options = options_of(SourceSettings)
"""--source, --revision, --sha256, --family: declared once on SourceSettings."""

TP_HELP = "Tensor-parallel GPUs."
TP_AUTO_HELP = (
    "Tensor-parallel GPUs, or auto (the default): on the FasterTransformer runtimes, the smallest tp x pp "
    "whose weights and KV cache (for --tune-batch sequences of the model's full context) fit the GPUs "
    "here, more instances on the GPUs left (a --pp or --instances given is kept); tp 1 on the python "
    "runtime. --dry-run says what and why."
)
PP_OPTION = click.option(
    "--pp", type=click.IntRange(1, 64), default=1, show_default=True, help="Pipeline-parallel stages."
)
WEIGHT_DTYPE_OPTION = click.option(
    "--weight-dtype",
    type=click.Choice(["auto", *WEIGHT_DTYPE_NAMES]),
    default="auto",
    show_default=True,
    help="Data type of the converted weight files; auto = the source's own (config.json's "
    "torch_dtype, else the weight files'), so an fp16 checkpoint is not doubled to fp32, except that "
    "`ftx run` on a FasterTransformer runtime converts to the compute type (an fp32 checkpoint served in "
    "fp16 gets fp16 files).",
)

conversion_options = section(
    "Conversion",
    click.option("--tp", type=click.IntRange(1, 64), default=1, show_default=True, help=TP_HELP),
    PP_OPTION,
    WEIGHT_DTYPE_OPTION,
)
"""--tp N, --pp, --weight-dtype: for the commands that convert or lay out at a tp the user names
(convert, configure, verify, image)."""

deployment_conversion_options = section(
    "Conversion",
    click.option("--tp", type=TpType(), default="auto", show_default=True, help=TP_AUTO_HELP),
    PP_OPTION,
    WEIGHT_DTYPE_OPTION,
)
"""The same with ``--tp auto`` as the default: ``ftx run`` and ``ftx lock``, which know the runtime (the
pipeline asks the chosen runtime's ``layout`` once the model's configuration is known)."""

repository_options = section(
    "Triton repository",
    click.option("--data-type", type=click.Choice(list(WEIGHT_DTYPE_NAMES)), help=DATA_TYPE_HELP),
    click.option(
        "--max-batch-size",
        type=click.IntRange(1, 4096),
        default=128,
        show_default=True,
        help="Largest batch Triton sends to the model.",
    ),
    click.option(
        "--instances",
        type=click.IntRange(1, 64),
        default=1,
        show_default=True,
        help="Model instances (each holds tp x pp GPUs).",
    ),
    click.option(
        "--text-instances",
        type=click.IntRange(1, 64),
        default=1,
        show_default=True,
        help="Instances (CPU processes) of the preprocessing and postprocessing models (a streaming "
        "deployment keeps one postprocessing instance: several could send a stream's pieces out of order).",
    ),
    click.option(
        "--text-batching/--no-text-batching",
        default=True,
        show_default=True,
        help="Triton's dynamic batcher in front of the preprocessing and postprocessing models: one Python "
        "call per group of queued requests (a streamed answer sends every piece through postprocessing).",
    ),
    click.option(
        "--streaming/--no-streaming",
        default=False,
        show_default=True,
        help="Decoupled model: one response per generated token (gRPC streaming).",
    ),
    click.option(
        "--stream-interval",
        type=click.IntRange(1, 4096),
        default=1,
        show_default=True,
        help="With --streaming: the model sends every Nth generated token's response and the last (each "
        "holds the whole text so far). 1 = every token, as FasterTransformer's backend does.",
    ),
    click.option(
        "--max-queue-size",
        type=click.IntRange(0, 1 << 20),
        default=0,
        show_default=True,
        help="Admission control: requests the model's queue holds; one more is refused at once (the OpenAI "
        "endpoint answers 429 with Retry-After). 0 = unbounded.",
    ),
    click.option(
        "--queue-timeout-ms",
        type=click.IntRange(0, 3_600_000),
        default=0,
        show_default=True,
        help="Admission control: a request that waited this long in the model's queue is refused. 0 = no limit.",
    ),
    click.option(
        "--dynamic-batching/--no-dynamic-batching",
        default=True,
        show_default=True,
        help="Batch requests of different prompt lengths (ragged input_ids).",
    ),
    click.option(
        "--custom-all-reduce/--no-custom-all-reduce",
        default=None,
        help="FasterTransformer's own all-reduce between the GPUs of one node at tp 2, 4 or 8 with one "
        "pipeline stage (ftx's kernels; GPUs without NVLink or PCIe peer access use NCCL, said in the "
        "server log). Default: on for fp16 at tp 2, where it was measured faster than NCCL; off elsewhere.",
    ),
    click.option(
        "--tokenizer",
        type=click.Path(exists=True, path_type=Path),
        help="Tokenizer files to use instead of the checkpoint's own.",
    ),
)

stage_options = section(
    "Stages and runtime",
    click.option(
        "--until", type=click.Choice(STAGES), default="serve", show_default=True, help="Stop after this stage."
    ),
    click.option(
        "--runtime",
        default="auto",
        show_default=True,
        help="auto, fastertransformer (its Docker or native launcher, on GPUs), python (embedded "
        "tritonserver, CPU or one GPU), or any runtime a plugin registers (see `ftx plugins`).",
    ),
    click.option(
        "--force",
        "force",
        multiple=True,
        type=click.Choice(STAGES),
        help="Redo this stage even if cached (repeatable).",
    ),
    click.option("--dry-run", is_flag=True, help="Print what would run, run nothing."),
)

tune_options = options_of(TuneSettings, only=("tune_batch", "tune_beam", "tune_max_input_len"))
"""--tune-batch, --tune-beam, --tune-max-input-len: declared once on TuneSettings."""

safety_options = section(
    "Safety",
    click.option(
        "--accept-license",
        is_flag=True,
        envvar="FTX_ACCEPT_LICENSE",
        show_envvar=True,
        help="Accept a non-commercial model licence (e.g. KoGPT's CC-BY-NC-ND-4.0); without it such a "
        "model is not fetched.",
    ),
    click.option(
        "--resource-check/--no-resource-check",
        default=True,
        show_default=True,
        help="Refuse to download, convert or serve what would not fit this machine's free disk "
        "(FTX_HOME) or memory (estimated from the model's parameter count and dtypes).",
    ),
)


__all__ = [
    "DATA_TYPE_HELP",
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
