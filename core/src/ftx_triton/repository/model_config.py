"""``config.pbtxt`` of the ``fastertransformer`` model, built as a protobuf message.

Never a text template: the message is built field by field from the family's declaration,
printed with ``text_format`` and parsed back before it is trusted.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from ftx_triton.conversion.family import POSITION_KEYS
from ftx_triton.errors import ConfigError, FtxError
from ftx_triton.formats.layout import gpu_dir_name
from ftx_triton.plan.settings import AUTO, DEFAULT_BATCH_DELAY_US, DEFAULT_TEXT_BATCH_DELAY_US, Auto
from ftx_triton.repository.io import (
    ENCODER_DECODER,
    ENCODER_INPUTS,
    ENCODER_MODEL_NAME,
    FT_MODEL_NAME,
    IO_KINDS,
    STREAM_OFFSET_DECL,
    TensorDecl,
    encoder_outputs,
    ft_outputs,
)
from ftx_triton.repository.stream_interval import StreamInterval

if TYPE_CHECKING:
    from ftx_triton.conversion.family import Family
    from ftx_triton.plan.settings import RunSettings

DEFAULT_MAX_BATCH_SIZE = 128
"""Default ``max_batch_size`` of every model in a repository.

fastertransformer_backend's clients send batches of 8 (``identity_test.py``, ``end_to_end_test.py``,
the sample requests), 32 in its guides and 128 (``evaluate_lambada.py``'s default); Triton refuses
a request whose batch exceeds ``max_batch_size`` outright, so the default takes all of them.
Upstream's samples say 1024. Memory stays bounded because the batch only caps what the dynamic
batcher may combine: FasterTransformer sizes its buffers per executed batch, and the python
runtime runs a batch as ``generate`` calls of at most ``FTX_MAX_BATCH_TOKENS`` tokens each.
"""
"""config.json keys that hold a decoder's context size (prompt + generated tokens)."""


DATA_TYPES: tuple[str, ...] = ("fp32", "fp16", "bf16")
"""Every compute type the backend knows; a family narrows it to what its model type really runs."""


CUSTOM_ALL_REDUCE: dict[tuple[str, int], bool] = {("fp16", 2): True, ("fp16", 4): True}
"""Whether FasterTransformer's custom all-reduce (ftx's kernels for 2, 4 and 8 GPUs of one node) is on by
default, per (compute type, tp); off wherever not listed. On where it was measured to win: fp16 at tp 2 on
two H100s (GPT-J-6B shape, greedy, batch 1/8/32: 1.4%/1.3%/2.6% faster than NCCL, generated ids equal) and at
tp 4 on four H200s (1.09x/1.09x/1.05x; ids differ from NCCL's, which adds the four partial sums in another
order; docs/benchmarks.md). bf16 at tp 2 and 4 passed the GPU suite with it on, but its speed is unmeasured;
tp 8 is built, not yet run."""


@dataclass(frozen=True)
class FtModelOptions:
    """Deployment choices for the fastertransformer model, and the facts of its model type."""

    model_type: str
    io_kind: str
    checkpoint_path: Path
    tp: int
    pp: int = 1
    data_type: str = "fp16"
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    instances: int = 1
    text_instances: int = 1
    """Instances of each Python-backend text model (preprocessing, postprocessing)."""
    text_batching: bool = True
    """Dynamic batching of each text model's requests (one Python call per queued group)."""
    text_batch_delay_us: int | None = None
    """``--text-batch-delay-us`` as given; None: ftx's default (:attr:`text_batch_delay`)."""
    streaming: bool = False
    stream_interval: int | Auto = AUTO
    """A decoupled model sends the first, every Nth and the last step's response (ftx's backend patch, the python runtime);
    :data:`AUTO`: every ceil(requests in the batch / R)th step (:mod:`ftx_triton.repository.stream_interval`)."""
    max_queue_size: int = 0
    """Triton's dynamic batcher queue bound for the model: a request beyond it is refused at once (0: none)."""
    queue_timeout_ms: int = 0
    """A queued request that waited this long is refused (0: no limit)."""
    batch_delay_us: int | None = None
    """``--batch-delay-us`` as given; None: ftx's default (:attr:`batch_delay`)."""
    dynamic_batching: bool = True
    backend: str = "fastertransformer"
    data_types: tuple[str, ...] = DATA_TYPES
    """Compute types FasterTransformer really runs for ``model_type`` (the family's ``data_types``)."""
    data_type_note: str = ""
    max_positions: int | None = None
    """A decoder's context size from the source's config.json (None: unknown, or not a decoder)."""
    output_dtypes: tuple[tuple[str, str], ...] = ()
    """(output, dtype) where ``model_type`` returns another dtype than its I/O kind's table."""
    custom_all_reduce: bool | None = None
    """FasterTransformer's custom all-reduce at tp > 1; None: :data:`CUSTOM_ALL_REDUCE` for the compute type and tp."""
    embeddings: bool = False
    """Also serve an encoder-decoder model's encoder alone (the ``encoder`` model, for ``/v1/embeddings``)."""

    @property
    def stream(self) -> StreamInterval:
        """Which steps the decoupled model sends (every step when not streaming)."""
        return stream_of(self.streaming, self.stream_interval)

    @property
    def batch_delay(self) -> int:
        """Triton's ``max_queue_delay_microseconds``: how long the batcher holds a batch's first request to batch
        more with it (0: none); :data:`DEFAULT_BATCH_DELAY_US` unless given, none without dynamic batching."""
        if self.batch_delay_us is not None:
            return self.batch_delay_us
        return DEFAULT_BATCH_DELAY_US if self.dynamic_batching else 0

    @property
    def text_batch_delay(self) -> int:
        """How long the ``preprocessing`` model's batcher holds a batch's first request (0: none);
        :data:`DEFAULT_TEXT_BATCH_DELAY_US` unless given, none without text batching."""
        if not self.text_batching:
            return 0
        return DEFAULT_TEXT_BATCH_DELAY_US if self.text_batch_delay_us is None else self.text_batch_delay_us

    @property
    def custom_all_reduce_on(self) -> bool:
        if self.custom_all_reduce is not None:
            return self.custom_all_reduce
        return CUSTOM_ALL_REDUCE.get((self.data_type, self.tp), False)

    @classmethod
    def for_family(cls, family: Family, checkpoint_path: Path, tp: int, **choices: Any) -> FtModelOptions:
        """Options for ``family``'s model type (type, I/O kind, compute types) plus the deployment ``choices``."""
        return cls(
            model_type=family.triton_model_type,
            io_kind=family.triton_io,
            checkpoint_path=checkpoint_path,
            tp=tp,
            data_types=tuple(family.data_types),
            data_type_note=family.data_type_note,
            output_dtypes=tuple(sorted(family.ft_output_dtypes.items())),
            **choices,
        )

    @classmethod
    def from_settings(
        cls, family: Family, checkpoint_path: Path, settings: RunSettings, source: Path | None = None
    ) -> FtModelOptions:
        """The fastertransformer model's options for ``family`` from the run's configure settings
        (and the ``source`` checkpoint's config.json, for a decoder's context size)."""
        repo = settings.configure
        positions = source_context_size(family, source) if source is not None else None
        return cls.for_family(
            family,
            checkpoint_path,
            settings.convert.planned_tp,
            pp=repo.pp,
            data_type=settings.data_type,
            max_batch_size=repo.max_batch_size,
            instances=repo.instances,
            text_instances=repo.text_instances,
            text_batching=repo.text_batching,
            text_batch_delay_us=repo.text_batch_delay_us,
            streaming=repo.streaming,
            stream_interval=repo.stream_interval,
            max_queue_size=repo.max_queue_size,
            queue_timeout_ms=repo.queue_timeout_ms,
            batch_delay_us=repo.batch_delay_us,
            dynamic_batching=repo.dynamic_batching,
            max_positions=positions,
            custom_all_reduce=repo.custom_all_reduce,
            embeddings=repo.embeddings,
        )


def stream_of(streaming: bool, interval: int | Auto) -> StreamInterval:
    """The stream interval of ``--stream-interval`` (every step when not ``streaming``)."""
    if not streaming:
        return StreamInterval()
    return StreamInterval(None if isinstance(interval, Auto) else interval)


def source_context_size(family: Family, source: Path) -> int | None:
    """A decoder's context size from its source's config.json; None for encoder-decoders (relative
    positions) or when the source has no readable config."""
    if family.triton_io != "decoder":
        return None
    try:
        return context_size(family.read_hf_config(Path(source)))
    except (FtxError, OSError, ValueError):
        return None


def context_size(hf_config: Mapping[str, object]) -> int | None:
    """The positions a decoder's config.json declares (prompt + generated tokens), if any."""
    for key in POSITION_KEYS:
        value = hf_config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def refuse_data_type(model_type: str, data_type: str, allowed: Sequence[str], note: str = "") -> None:
    """Refuse a ``data_type`` outside ``allowed``, what FasterTransformer really runs for ``model_type``."""
    if data_type in allowed:
        return
    reason = note or f"FasterTransformer runs {model_type} in {', '.join(allowed)} only"
    raise ConfigError(
        f"data_type {data_type!r} is not supported for {model_type}: {reason}",
        hint=f"use --data-type {' or '.join(allowed)}",
    )


def check_data_type(family: Family, data_type: str) -> None:
    """Refuse a ``data_type`` FasterTransformer would not really run for ``family``'s model type."""
    refuse_data_type(family.triton_model_type, data_type, family.data_types, family.data_type_note)


def check_ft_options(opts: FtModelOptions) -> None:
    """Values the fastertransformer backend refuses at load, refused here instead.

    Streaming (decoupled) is not refused with any batching ftx writes: the backend streams with
    dynamic and ragged batching (releases before r23.05 ran decoupled requests one at a time,
    fastertransformer_backend#149), and Triton streams a decoupled model through the ensemble.
    FasterTransformer's other batching mode, sequence batching, exists for model_type GPT only
    (max_batch_size 1, never with dynamic batching); ftx never writes it.
    """
    if opts.io_kind not in IO_KINDS:
        raise ConfigError(f"unknown I/O kind {opts.io_kind!r}", hint=f"use one of: {', '.join(IO_KINDS)}")
    if opts.tp < 1 or opts.pp < 1:
        raise ConfigError(f"tensor_para_size and pipeline_para_size must be at least 1 (got {opts.tp}, {opts.pp})")
    if opts.max_batch_size < 1:
        raise ConfigError(
            "max_batch_size must be at least 1 (the backend batches along the first dimension)",
            hint="use --max-batch-size 1 or more",
        )
    if opts.instances < 1:
        raise ConfigError("the instance count must be at least 1", hint="use --instances 1 or more")
    if opts.text_instances < 1:
        raise ConfigError("the text models' instance count must be at least 1", hint="use --text-instances 1 or more")
    check_serving_options(opts)
    if opts.backend == "fastertransformer":
        refuse_data_type(opts.model_type, opts.data_type, opts.data_types, opts.data_type_note)


def check_serving_options(opts: FtModelOptions) -> None:
    """The stream interval and the bounded queue need what they act on (a stream, the dynamic batcher)."""
    interval = opts.stream_interval
    if not isinstance(interval, Auto) and interval < 1:
        raise ConfigError(
            "the stream interval must be at least 1", hint="use --stream-interval auto, or a number of 1 or more"
        )
    if not isinstance(interval, Auto) and interval > 1 and not opts.streaming:
        raise ConfigError(
            f"--stream-interval {opts.stream_interval} needs a streaming deployment",
            hint="add --streaming, or leave --stream-interval out (auto, which only a stream uses)",
        )
    if opts.max_queue_size < 0 or opts.queue_timeout_ms < 0:
        raise ConfigError("the queue size and timeout cannot be negative", hint="use 0 for no bound")
    if opts.batch_delay_us is not None and opts.batch_delay_us < 0:
        raise ConfigError("the batch delay cannot be negative", hint="use 0 for none")
    if opts.text_batch_delay_us is not None and opts.text_batch_delay_us < 0:
        raise ConfigError("the text batch delay cannot be negative", hint="use 0 for none")
    if opts.text_batch_delay_us and not opts.text_batching:
        raise ConfigError(
            "--text-batch-delay-us sets the preprocessing model's dynamic batcher, which --no-text-batching turns off",
            hint="leave --no-text-batching out, or use --text-batch-delay-us 0",
        )
    if (opts.max_queue_size or opts.queue_timeout_ms or opts.batch_delay_us) and not opts.dynamic_batching:
        raise ConfigError(
            "--max-queue-size, --queue-timeout-ms and --batch-delay-us set the dynamic batcher's queue, which "
            "--no-dynamic-batching turns off",
            hint="leave --no-dynamic-batching out, or the queue options",
        )


def add_queue_policy(config: mc.ModelConfig, opts: FtModelOptions) -> None:
    """Admission control: Triton's dynamic batcher refuses a request beyond ``max_queue_size`` at once, and one
    that waited ``queue_timeout_ms`` in the queue, with its own error (the OpenAI endpoint answers 429)."""
    if not (opts.max_queue_size or opts.queue_timeout_ms):
        return
    policy = config.dynamic_batching.default_queue_policy
    policy.max_queue_size = opts.max_queue_size
    if opts.queue_timeout_ms:
        policy.timeout_action = mc.ModelQueuePolicy.TimeoutAction.REJECT
        policy.default_timeout_microseconds = opts.queue_timeout_ms * 1000
        policy.allow_timeout_override = True


def _add_tensor(collection: object, decl: TensorDecl, output: bool = False) -> None:
    item = collection.add()  # type: ignore[attr-defined]
    item.name = decl.name
    item.data_type = mc.DataType.Value(f"TYPE_{decl.dtype}")
    item.dims.extend(decl.dims)
    if decl.reshape is not None:
        item.reshape.shape.extend(decl.reshape)
    if not output:
        item.optional = decl.optional
        item.allow_ragged_batch = decl.ragged


def add_inputs_outputs(config: mc.ModelConfig, inputs: Sequence[TensorDecl], outputs: Sequence[TensorDecl]) -> None:
    for decl in inputs:
        _add_tensor(config.input, decl)
    for decl in outputs:
        _add_tensor(config.output, decl, output=True)


def set_parameters(config: mc.ModelConfig, params: Mapping[str, str]) -> None:
    for key, value in params.items():
        config.parameters[key].string_value = str(value)


def build_ft_model_config(opts: FtModelOptions, *, stream_offset: bool = False) -> mc.ModelConfig:
    """The fastertransformer model's config as a ModelConfig message. ``stream_offset``: the model (ftx's
    patched backend, the python runtime) answers ``ftx_stream_offset`` when streaming, so it is declared."""
    check_ft_options(opts)
    config = mc.ModelConfig(name=FT_MODEL_NAME, backend=opts.backend, max_batch_size=opts.max_batch_size)
    inputs, outputs = IO_KINDS[opts.io_kind][0], ft_outputs(opts.io_kind, dict(opts.output_dtypes))
    if opts.dynamic_batching:
        # Ragged batching: requests with different prompt lengths batch together; the
        # backend right-pads input_ids with 0 up to the longest (lengths travel separately).
        inputs = tuple(
            TensorDecl(d.name, d.dtype, d.dims, d.optional, d.reshape, ragged=True) if d.name == "input_ids" else d
            for d in inputs
        )
        batch_input = config.batch_input.add()
        batch_input.kind = mc.BatchInput.Kind.BATCH_ITEM_SHAPE
        batch_input.target_name.append("input_ids_item_shape")
        batch_input.data_type = mc.DataType.TYPE_INT32
        batch_input.source_input.append("input_ids")
    add_inputs_outputs(config, inputs, outputs)
    group = config.instance_group.add()
    group.count = opts.instances
    group.kind = mc.ModelInstanceGroup.Kind.KIND_CPU
    config.model_transaction_policy.decoupled = opts.streaming
    if opts.dynamic_batching:
        config.dynamic_batching.SetInParent()
        config.dynamic_batching.max_queue_delay_microseconds = opts.batch_delay
        add_queue_policy(config, opts)
    set_parameters(config, opts.stream.parameters())
    set_parameters(config, backend_parameters(opts, opts.model_type))
    if stream_offset and opts.streaming:
        add_inputs_outputs(config, (), (STREAM_OFFSET_DECL,))
    return config


def backend_parameters(opts: FtModelOptions, model_type: str) -> dict[str, str]:
    """What FasterTransformer's backend reads from a model's ``parameters``: its type, layout and files."""
    return {
        "model_type": model_type,
        "tensor_para_size": str(opts.tp),
        "pipeline_para_size": str(opts.pp),
        "model_checkpoint_path": str(opts.checkpoint_path),
        "data_type": opts.data_type,
        "enable_custom_all_reduce": "1" if opts.custom_all_reduce_on else "0",
    }


ENCODER_MODEL_TYPE = "T5-Encoder"
"""fastertransformer_backend's model type for a T5 encoder alone (the same converted files as ``T5``)."""


def check_embeddings(opts: FtModelOptions, family_name: str) -> None:
    """``--embeddings`` needs an encoder: an encoder-decoder model."""
    if opts.embeddings and opts.io_kind != ENCODER_DECODER:
        raise ConfigError(
            f"--embeddings serves an encoder-decoder model's encoder, and {family_name} is a decoder-only model",
            hint="leave --embeddings out (embeddings come from an encoder-decoder model)",
        )


def build_encoder_model_config(opts: FtModelOptions, *, backend: str) -> mc.ModelConfig:
    """The ``encoder`` model: the encoder-decoder checkpoint's encoder, one instance, batches as sent (its inputs
    are padded by the client; no dynamic batcher), its hidden states in the compute type (where FasterTransformer's
    backend sets them; the python runtime declares float32 instead)."""
    config = mc.ModelConfig(name=ENCODER_MODEL_NAME, backend=backend, max_batch_size=opts.max_batch_size)
    add_inputs_outputs(config, ENCODER_INPUTS, encoder_outputs(opts.data_type))
    group = config.instance_group.add()
    group.count = 1
    group.kind = mc.ModelInstanceGroup.Kind.KIND_CPU
    set_parameters(config, backend_parameters(opts, ENCODER_MODEL_TYPE))
    return config


def build_python_model_config(
    name: str,
    inputs: Sequence[TensorDecl],
    outputs: Sequence[TensorDecl],
    *,
    max_batch_size: int,
    parameters: Mapping[str, str],
    instances: int = 1,
    batching: bool = False,
    delay_us: int = 0,
) -> mc.ModelConfig:
    """A Python-backend model (preprocessing, postprocessing) on CPU. ``batching``: Triton's dynamic batcher
    hands the model every queued request in one call (ragged: the model answers each request on its own,
    so their shapes need not agree), holding the first up to ``delay_us`` for others."""
    config = mc.ModelConfig(name=name, backend="python", max_batch_size=max_batch_size)
    if batching:
        inputs = [dataclasses.replace(decl, ragged=True) for decl in inputs]
        config.dynamic_batching.SetInParent()
        if delay_us:
            config.dynamic_batching.max_queue_delay_microseconds = delay_us
    add_inputs_outputs(config, inputs, outputs)
    group = config.instance_group.add()
    group.count = instances
    group.kind = mc.ModelInstanceGroup.Kind.KIND_CPU
    set_parameters(config, parameters)
    return config


def parameter(config: mc.ModelConfig, key: str) -> str | None:
    """A ``parameters`` string value, or None when absent."""
    return config.parameters[key].string_value if key in config.parameters else None


def check_ft_config(config: mc.ModelConfig, path: Path | None = None) -> list[str]:
    """Rules a fastertransformer-backend config must satisfy; returns the problems."""
    where = f"{path}: " if path else ""
    problems = []
    if config.name != FT_MODEL_NAME:
        problems.append(f"{where}name is {config.name!r}, not {FT_MODEL_NAME!r}")
    if config.max_batch_size < 1:
        problems.append(f"{where}max_batch_size must be at least 1")
    kinds = [mc.ModelInstanceGroup.Kind.Name(g.kind) for g in config.instance_group]
    if kinds != ["KIND_CPU"]:
        problems.append(f"{where}needs exactly one KIND_CPU instance group (has {kinds or 'none'})")
    for key in ("model_type", "tensor_para_size", "pipeline_para_size", "model_checkpoint_path", "data_type"):
        if not parameter(config, key):
            problems.append(f"{where}parameter {key} is not set")
    if config.HasField("sequence_batching") and config.HasField("dynamic_batching"):
        problems.append(f"{where}sequence batching cannot be combined with dynamic batching")
    ragged = [i.name for i in config.input if i.allow_ragged_batch]
    shapes = {
        b.source_input[0]
        for b in config.batch_input
        if b.kind == mc.BatchInput.Kind.BATCH_ITEM_SHAPE
        and b.data_type == mc.DataType.TYPE_INT32
        and list(b.target_name) == [f"{b.source_input[0]}_item_shape"]
    }
    for name in ragged:
        if name not in shapes:
            problems.append(f"{where}ragged input {name} needs a BATCH_ITEM_SHAPE batch input {name}_item_shape")
    return problems


_RANK_FILE = re.compile(r"(?<=[A-Za-z_])\.(\d+)\.bin$")


def checkpoint_ranks(checkpoint_dir: Path) -> set[int]:
    """Tensor-parallel ranks present in a ``<tp>-gpu`` directory (``….weight.<rank>.bin`` files)."""
    ranks = set()
    for path in checkpoint_dir.glob("*.bin"):
        if match := _RANK_FILE.search(path.name):
            ranks.add(int(match.group(1)))
    return ranks


def check_against_checkpoint(
    config: mc.ModelConfig,
    ini: Mapping[str, Mapping[str, str]],
    checkpoint_dir: Path,
    *,
    sections: Sequence[str] = (),
    data_types: Sequence[str] = DATA_TYPES,
) -> list[str]:
    """config.pbtxt parameters that disagree with the checkpoint (tp, dtype) or with the model type's facts:
    the config.ini ``sections`` it reads and the compute ``data_types`` it runs."""
    problems = []
    tp = parameter(config, "tensor_para_size") or ""
    model_type = parameter(config, "model_type") or ""
    data_type = parameter(config, "data_type") or ""
    if checkpoint_dir.name != gpu_dir_name(tp):
        problems.append(f"tensor_para_size {tp} but model_checkpoint_path is {checkpoint_dir.name}")
    ranks = checkpoint_ranks(checkpoint_dir)
    if ranks and (ranks != set(range(len(ranks))) or str(len(ranks)) != tp):
        problems.append(
            f"tensor_para_size {tp} but the weight files in {checkpoint_dir} are split for ranks {sorted(ranks)}"
        )
    if not all(s in ini for s in sections):
        problems.append(
            f"model_type {model_type} reads config.ini section(s) {', '.join(sections)}, "
            f"but {checkpoint_dir / 'config.ini'} has {', '.join(ini) or 'none'}"
        )
    weight_types = {v["weight_data_type"] for v in ini.values() if "weight_data_type" in v}
    if len(weight_types) != 1 or not weight_types <= set(DATA_TYPES):
        problems.append(f"config.ini weight_data_type is {sorted(weight_types) or 'missing'}")
    if data_type not in data_types:
        problems.append(f"data_type {data_type} is not run by FasterTransformer for {model_type}")
    return problems


def write_config(config: mc.ModelConfig, model_dir: Path) -> Path:
    """Print the message to ``<model_dir>/config.pbtxt``, parse it back, and check equality."""
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "1").mkdir(exist_ok=True)
    path = model_dir / "config.pbtxt"
    path.write_text(text_format.MessageToString(config))
    if parse_config(path) != config:
        raise ConfigError(f"{path} does not parse back to the config that was built")
    return path


def parse_config(path: Path) -> mc.ModelConfig:
    """Parse a config.pbtxt through the Triton schema."""
    try:
        return text_format.Parse(path.read_text(), mc.ModelConfig())
    except text_format.ParseError as exc:
        raise ConfigError(f"{path} is not a valid Triton model config: {exc}") from exc
