"""``config.pbtxt`` of the ``fastertransformer`` model, built as a protobuf message.

Never a text template: the message is built field by field from the family's declaration,
printed with ``text_format`` and parsed back before it is trusted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from ftx.errors import ConfigError
from ftx.triton.io import IO_KINDS, TensorDecl

FT_MODEL_NAME = "fastertransformer"


@dataclass(frozen=True)
class FtModelOptions:
    """Deployment choices for the fastertransformer model."""

    model_type: str
    io_kind: str
    checkpoint_path: Path
    tp: int
    pp: int = 1
    data_type: str = "fp16"
    max_batch_size: int = 8
    instances: int = 1
    streaming: bool = False
    dynamic_batching: bool = True
    backend: str = "fastertransformer"


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


def build_ft_model_config(opts: FtModelOptions) -> mc.ModelConfig:
    """The fastertransformer model's config as a ModelConfig message."""
    if opts.io_kind not in IO_KINDS:
        raise ConfigError(f"unknown I/O kind {opts.io_kind!r}")
    config = mc.ModelConfig(name=FT_MODEL_NAME, backend=opts.backend, max_batch_size=opts.max_batch_size)
    inputs, outputs = IO_KINDS[opts.io_kind]
    if opts.dynamic_batching and opts.io_kind == "decoder":
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
    set_parameters(config, {
        "model_type": opts.model_type,
        "tensor_para_size": str(opts.tp),
        "pipeline_para_size": str(opts.pp),
        "model_checkpoint_path": str(opts.checkpoint_path),
        "data_type": opts.data_type,
        "enable_custom_all_reduce": "0",
    })
    return config


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
