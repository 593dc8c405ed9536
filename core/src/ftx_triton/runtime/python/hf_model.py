"""Rebuild a ``transformers`` model from a converted FasterTransformer ``<tp>-gpu`` directory.

The Hugging Face config comes from ``config.ini`` (``family.hf_config_from_ini``) and the
weights from the FT ``.bin`` files through the family's inverted table
(:func:`ftx_triton.conversion.convert.invert_checkpoint`), for any tensor-parallel size. Nothing is read from the
original checkpoint, which is what makes the python runtime a proof that the converted files
hold the model.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from ftx_triton.conversion.convert import invert_checkpoint
from ftx_triton.conversion.family import Family
from ftx_triton.errors import CheckpointError, ConfigError
from ftx_triton.formats.ftformat import read_ini

log = structlog.get_logger(__name__)

DEVICES = ("auto", "cpu", "cuda")
_TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True)
class LoadedModel:
    """A rebuilt model and what it was built from."""

    model: Any  # transformers.PreTrainedModel, in eval mode
    config: Any  # transformers.PretrainedConfig
    device: Any  # torch.device
    dtype: Any  # torch.dtype
    ini: dict[str, dict[str, str]]
    seconds: float
    imports_s: float = 0.0
    """Of ``seconds``: importing torch and the transformers model class."""

    @property
    def is_encoder_decoder(self) -> bool:
        return bool(getattr(self.config, "is_encoder_decoder", False))


def resolve_device(requested: str = "auto") -> Any:
    """``auto`` → the first CUDA device when torch sees one, else CPU."""
    import torch

    if requested not in DEVICES and not requested.startswith("cuda:"):
        raise ConfigError(f"unknown device {requested!r}", hint="use auto, cpu or cuda")
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            "--device cuda was asked for but torch sees no CUDA device",
            hint="use --device cpu, or install a CUDA build of torch",
        )
    return torch.device(requested)


def torch_dtype(data_type: str | None, device: Any) -> Any:
    """The compute dtype for an FT ``data_type`` on ``device`` (fp16 runs as fp32 on CPU)."""
    import torch

    name = _TORCH_DTYPES.get(data_type or "fp32")
    if name is None:
        raise ConfigError(f"unknown data_type {data_type!r}", hint="use fp32, fp16 or bf16")
    if name == "float16" and device.type == "cpu":
        log.info("runtime.dtype_promoted", data_type=data_type, to="fp32", reason="CPU kernels for fp16 are slow")
        name = "float32"
    return getattr(torch, name)


POSITION_ATTRIBUTES = ("n_positions", "max_position_embeddings")


def read_ft_ini(ft_dir: Path) -> dict[str, dict[str, str]]:
    """``<ft_dir>/config.ini``, parsed; a directory without one is refused."""
    if not (ft_dir / "config.ini").is_file():
        raise CheckpointError(f"{ft_dir} holds no config.ini", hint="point at a converted <tp>-gpu directory")
    return read_ini(ft_dir / "config.ini")


@contextlib.contextmanager
def default_dtype(dtype: Any) -> Iterator[None]:
    """torch's default dtype is ``dtype`` inside, as when transformers builds a model under its compute dtype
    (tables computed at init, such as rotary ones, are then computed in that dtype)."""
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def hf_config_for(family: Family, ini: dict[str, dict[str, str]], max_positions: int | None = None) -> Any:
    """The transformers config rebuilt from a converted directory's parsed config.ini (:func:`read_ft_ini`).

    FasterTransformer's config.ini has no context size for rotary models, so the rebuilt config
    would hold transformers' default; ``max_positions`` (the source checkpoint's) replaces it.
    """
    from transformers import AutoConfig

    data = dict(family.hf_config_from_ini(ini))
    model_type = data.pop("model_type", None) or family.name
    config = AutoConfig.for_model(model_type, **data)
    # transformers 5 builds some models tied whatever the flag says (T5: the flag only picks decoder-output
    # scaling) and unties them only when loading a checkpoint whose head differs; ftx loads tensors itself
    config.ftx_untied_head = data.get("tie_word_embeddings") is False
    if max_positions:
        for name in POSITION_ATTRIBUTES:
            if hasattr(config, name):
                setattr(config, name, int(max_positions))
    return config


def _model_class(family: Family, config: Any) -> Any:
    import transformers

    transformers.logging.set_verbosity_error()

    name = family.hf_model_class or next(iter(getattr(config, "architectures", None) or ()), "")
    cls = getattr(transformers, name, None) if name else None
    if cls is None:
        raise ConfigError(
            f"family {family.name} names no transformers model class ({name!r})",
            hint="set hf_model_class on the family (e.g. 'GPTJForCausalLM')",
        )
    return cls


def load_model(
    family: Family,
    ft_dir: Path,
    *,
    device: str = "auto",
    data_type: str | None = None,
    max_positions: int | None = None,
) -> LoadedModel:
    """Build ``family``'s transformers model from the FT files in ``ft_dir`` (a ``<tp>-gpu`` dir);
    ``max_positions``: the source checkpoint's context size (see :func:`hf_config_for`)."""
    started = time.perf_counter()
    import torch

    no_init_weights = _no_init_weights()
    ft_dir = Path(ft_dir)
    ini = read_ft_ini(ft_dir)
    target = resolve_device(device)
    dtype = torch_dtype(data_type, target)
    config = hf_config_for(family, ini, max_positions)
    cls = _model_class(family, config)
    imports_s = time.perf_counter() - started
    # Built the way ``from_pretrained(..., dtype=…).to(device)`` builds it: on the CPU under the
    # compute dtype, then moved. Non-parameter tables computed at init (GPT-J's sinusoidal
    # positions) then hold the same values as there; computed on a GPU they round differently.
    # Parameters are made on the meta device (no memory, no initialisation) and then assigned the
    # tensors read from the files: the weights are never held twice, nor copied once more.
    with default_dtype(dtype), no_init_weights(), _parameters_on_meta(), torch.device("cpu"):
        model = cls(config)
    model.eval()
    untied = getattr(config, "ftx_untied_head", False)
    if untied:
        _untie_head(model)
    tensors = tensors_from_files(family, ft_dir, model.state_dict(keep_vars=True), _renamer(cls, config), cls.__name__)
    model.load_state_dict(tensors, strict=False, assign=True)
    loaded = set(tensors)
    head = model.get_output_embeddings()
    kept_head = head.weight if untied and head is not None else None
    model.tie_weights()  # tied parameters (T5's embed_tokens, a tied lm_head) share the loaded tensor again
    if kept_head is not None and head.weight is not kept_head:  # transformers 5 re-tied the head: undo that
        head.weight = kept_head
    state = model.state_dict(keep_vars=True)
    check_complete(model, state, loaded, ft_dir)
    model.to(target)
    seconds = time.perf_counter() - started
    log_loaded(
        family,
        ft_dir,
        target,
        dtype,
        len(loaded),
        seconds,
        imports_s,
        attention=getattr(config, "_attn_implementation", None),
    )
    return LoadedModel(model, config, target, dtype, ini, seconds, imports_s)


def log_loaded(
    family: Family, ft_dir: Path, device: Any, dtype: Any, tensors: int, seconds: float, imports_s: float, **extra: Any
) -> None:
    """The ``runtime.model_loaded`` event (its seconds are what ``bench_cached_run.py`` reports as the build)."""
    log.info(
        "runtime.model_loaded",
        family=family.name,
        path=str(ft_dir),
        device=str(device),
        dtype=str(dtype).replace("torch.", ""),
        tensors=tensors,
        seconds=round(seconds, 2),
        imports_s=round(imports_s, 2),
        **extra,
    )


def tensors_from_files(family: Family, ft_dir: Path, state: dict[str, Any], rename: Any, owner: str) -> dict[str, Any]:
    """The tensors of ``ft_dir``'s files by parameter name (``rename``: checkpoint name -> the model's), each
    checked against ``state`` (the model's parameters, on the meta device or not) and cast to its dtype; a
    tensor whose dtype needs no cast is the memory-mapped file itself."""
    tensors: dict[str, Any] = {}
    for original, array in invert_checkpoint(family, ft_dir, as_stored=True):
        name = rename(original)
        if name not in state:
            raise CheckpointError(f"{ft_dir}: the {family.name} table yields {name!r}, which {owner} does not have")
        param = state[name]
        if tuple(param.shape) != tuple(array.shape):
            raise CheckpointError(
                f"{ft_dir}: {name} has shape {tuple(array.shape)}, {owner} expects {tuple(param.shape)}",
                hint="the config.ini does not match the .bin files; re-run the conversion",
            )
        tensor = as_torch(array).to(param.dtype)  # no copy (the mapped file) when the dtype is right
        # a transposed view is copied once: matmul on a strided weight takes another kernel, whose rounding
        # would make this reference differ from the model in the last bits
        tensors[name] = tensor if tensor.is_contiguous() else tensor.contiguous()
    return tensors


def as_torch(array: Any) -> Any:
    """``array`` as a torch tensor sharing its memory (a strided view stays one); bfloat16 (ml_dtypes,
    which torch does not know) through its bits."""
    import numpy as np
    import torch

    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _untie_head(model: Any) -> None:
    """Give the output embedding its own parameter when the model was built sharing the input's."""
    import torch

    head, inputs = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or inputs is None or head.weight is not inputs.weight:
        return
    head.weight = torch.nn.Parameter(head.weight.detach().clone())


def _renamer(cls: Any, config: Any) -> Any:
    """Checkpoint names -> this transformers' parameter names (transformers 5 renamed some, e.g.
    GPT-NeoX's ``embed_out`` to ``lm_head``, and maps the old names when loading; so does ftx)."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
        from transformers.core_model_loading import WeightRenaming
    except ImportError:  # transformers 4: names are as the checkpoints have them
        return lambda name: name
    rules: list[tuple[str, str]] = []
    for key in dict.fromkeys((cls.__name__, getattr(config, "model_type", ""))):
        for transform in get_checkpoint_conversion_mapping(key) or ():
            if isinstance(transform, WeightRenaming):
                rules += list(zip(transform.source_patterns, transform.target_patterns, strict=False))

    def rename(name: str) -> str:
        for source, target in rules:
            name = re.sub(source, target, name)
        return name

    return rename


def _parameters_on_meta() -> Any:
    """transformers' context that makes parameters on the meta device and buffers where they would be (GPT-J's
    position table is computed at init); without it (a transformers that moved it), parameters are allocated."""
    try:
        from transformers.integrations.accelerate import init_empty_weights
    except ImportError:  # pragma: no cover - depends on the transformers release
        return contextlib.nullcontext()
    return init_empty_weights(include_buffers=False)


def _no_init_weights() -> Any:
    """transformers' context that skips weight initialisation (moved in transformers 5)."""
    try:
        from transformers.initialization import no_init_weights  # transformers >= 5
    except ImportError:
        from transformers.modeling_utils import no_init_weights  # transformers 4
    return no_init_weights


def check_complete(model: Any, state: dict[str, Any], loaded: set[str], ft_dir: Path) -> None:
    """Every parameter must come from the files, or be tied to one that did."""
    buffers = {name for name, _ in model.named_buffers()}
    loaded_ptrs = {state[name].data_ptr() for name in loaded}
    missing = [
        name
        for name, tensor in state.items()
        if name not in loaded and name not in buffers and tensor.data_ptr() not in loaded_ptrs
    ]
    if missing:
        shown = ", ".join(missing[:5]) + (" …" if len(missing) > 5 else "")
        raise CheckpointError(
            f"{ft_dir} does not provide {len(missing)} weight(s) of the model: {shown}",
            hint="the family table cannot rebuild these tensors; re-convert or fix the table",
        )
