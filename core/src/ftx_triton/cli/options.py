"""Click options shared by several commands, and turning them into RunSettings."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ftx_triton.cli.common import set_help_section
from ftx_triton.conversion.dtypes import WEIGHT_DTYPES
from ftx_triton.plan.settings import STAGES

F = Callable[..., Any]

PORT = click.IntRange(1, 65535)
CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
"""The CPU build of torch (the default wheel is the CUDA build, several GB): what the kit and verify need."""


class TpType(click.IntRange):
    """``--tp``: 1-64, or ``auto`` (0 in the settings: the placement planner picks tp x pp from the GPUs here)."""

    name = "1-64|auto"

    def __init__(self) -> None:
        super().__init__(1, 64)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value.strip().lower() == "auto":
            return 0
        return super().convert(value, param, ctx)


"""Every TCP port option (--http-port, --grpc-port, --metrics-port, --openai-port): refused outside 1-65535."""


class FiniteFloatRange(click.FloatRange):
    """A FloatRange that also refuses ``nan`` and ``inf`` (click's range check lets NaN through, and an
    infinite timeout overflows the socket's)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def section(title: str, *decorators: F) -> Callable[[F], F]:
    """Apply click option decorators and list their options under ``title`` in --help."""

    def apply(func: F) -> F:
        before = len(getattr(func, "__click_params__", []))
        for decorator in reversed(decorators):
            func = decorator(func)
        for param in getattr(func, "__click_params__", [])[before:]:
            set_help_section(param, title)
        return func

    return apply


DATA_TYPE_HELP = (
    "Compute type (default: the runtime's own — fp16 on the fastertransformer runtime — else the "
    "weight dtype; the python runtime computes fp16 as fp32 on a CPU; --dry-run shows the choice)."
)

source_options = section(
    "Source",
    click.option("--source", help="Checkpoint to use instead of the preset's: a path, hf://org/name[@rev] or a URL."),
    click.option("--revision", help="Branch, tag or commit of a Hugging Face source."),
    click.option("--sha256", help="Expected sha256 of a downloaded archive or file (checked before use)."),
    click.option("--family", help="Model family (see `ftx models`); detected from config.json when omitted."),
)

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
    type=click.Choice(["auto", *WEIGHT_DTYPES]),
    default="auto",
    show_default=True,
    help="Data type of the converted weight files; auto = the source's own (config.json's "
    "torch_dtype, else the weight files'), so an fp16 checkpoint is not doubled to fp32.",
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
pipeline resolves tp 0 through the placement planner once the model's configuration is known)."""

repository_options = section(
    "Triton repository",
    click.option("--data-type", type=click.Choice(list(WEIGHT_DTYPES)), help=DATA_TYPE_HELP),
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
        "--dynamic-batching/--no-dynamic-batching",
        default=True,
        show_default=True,
        help="Batch requests of different prompt lengths (ragged input_ids).",
    ),
    click.option(
        "--custom-all-reduce/--no-custom-all-reduce",
        default=None,
        help="FasterTransformer's own all-reduce between the GPUs of a node (it has kernels for 8 "
        "GPUs of one node only; any other tp x pp uses NCCL either way). Default: off, for "
        "every compute type (docs/benchmarks.md).",
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

docker_options = section(
    "FasterTransformer runtime (Docker)",
    click.option("--image", help="FasterTransformer image (default: the one `ftx image build` makes)."),
    click.option("--gpus", help="Host GPU indices to use, e.g. 0,1,2,3 (default: the first tp x pp)."),
    click.option("--docker-host", help="Docker daemon URL (default: DOCKER_HOST or the local socket)."),
)
"""Where the fastertransformer runtime runs."""

serve_container_options = section(
    "FasterTransformer runtime (Docker)",
    click.option("--shm-size", help="Shared memory of the server container [default: 1g]."),
    click.option(
        "--env", multiple=True, help="KEY=VALUE for the server container (repeatable), e.g. FT_LOG_LEVEL=DEBUG."
    ),
    click.option(
        "--hosts",
        type=click.Path(exists=True, dir_okay=False),
        help="Multi-node: a file with one host per line (GPUs per node x nodes must equal tp x pp; "
        "the native launcher also takes a machine on several lines, one process each).",
    ),
    click.option(
        "--ssh-port",
        type=click.IntRange(1, 65535),
        help="Multi-node: the ssh port mpirun reaches the other machines on [default: 22 natively, 2222 in Docker].",
    ),
)

tune_options = section(
    "GEMM tuning",
    click.option(
        "--tune-batch",
        type=click.IntRange(1, 4096),
        default=8,
        show_default=True,
        help="Batch size to tune for (the decoder GEMMs run at batch x beam rows).",
    ),
    click.option(
        "--tune-beam", type=click.IntRange(1, 64), default=1, show_default=True, help="Beam width to tune for."
    ),
    click.option(
        "--tune-max-input-len",
        type=click.IntRange(1, 65536),
        default=512,
        show_default=True,
        help="Longest prompt (tokens) to tune the context GEMMs for.",
    ),
)

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
