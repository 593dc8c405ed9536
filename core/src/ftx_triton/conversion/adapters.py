"""Fine-tuned adapters: a PEFT LoRA adapter checked against its base checkpoint, then merged into its weights.

The merge itself is the ``peft`` library's (``PeftModel.from_pretrained(...).merge_and_unload()``); what ftx
adds is the trust boundary around it: an adapter folder comes from a stranger, so it must hold
``adapter_config.json`` and safetensors weights (a pickle, ``adapter_model.bin``, is never loaded), no link in
it may lead out of it, it must be a LoRA adapter, and every module it changes must exist in the base with the
shape it was trained for. Each refusal names what is wrong and how to fix it before anything is cached.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftx_triton.errors import CheckpointError, SourceError

if TYPE_CHECKING:
    from ftx_triton.conversion.family import Family

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PICKLED_WEIGHTS = ("adapter_model.bin", "adapter_model.pt", "adapter_model.pth")
ADAPTER_PATTERNS = (ADAPTER_CONFIG, ADAPTER_WEIGHTS, *PICKLED_WEIGHTS)
"""What a hub adapter download takes (a pickle only to refuse it by name)."""
MERGE_VERSION = 1
"""Part of a merged checkpoint's cache key: bump when the merge writes other bytes."""
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".index.json")
_SAVE_HINT = (
    "save the adapter with peft's `model.save_pretrained(folder)` (safetensors, the default): the folder holds "
    f"{ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}"
)


@dataclass(frozen=True)
class LoraDelta:
    """One base weight a LoRA adapter changes: ``weight`` (the base's tensor name) gets ``B @ A``."""

    weight: str
    rank: int
    shape: tuple[int, int]
    """(out, in): the base weight's shape the adapter was trained for."""


def check_adapter_folder(folder: Path) -> dict[str, Any]:
    """The adapter's config after checking the folder itself (before any of it is keyed or read as weights)."""
    from ftx_triton.io.jsonfile import read_json_object
    from ftx_triton.io.trees import link_leaving

    if not folder.is_dir():
        raise SourceError(f"adapter {folder} is not a folder", hint=_SAVE_HINT)
    if (escape := link_leaving(folder)) is not None:
        raise SourceError(
            f"adapter {folder}: {escape} is a link that leads out of the adapter folder",
            hint="copy the file into the folder instead of linking to it",
        )
    config_path = folder / ADAPTER_CONFIG
    if not config_path.is_file():
        raise SourceError(f"adapter {folder} has no {ADAPTER_CONFIG}, so it is no PEFT adapter", hint=_SAVE_HINT)
    if not (folder / ADAPTER_WEIGHTS).is_file():
        pickled = [name for name in PICKLED_WEIGHTS if (folder / name).exists()]
        if pickled:
            raise SourceError(
                f"adapter {folder} holds its weights as a pickle ({pickled[0]}), which ftx never loads "
                "(unpickling runs code the file chooses)",
                hint="convert it to safetensors where you trust it: load it with peft and "
                "`save_pretrained(folder, safe_serialization=True)`",
            )
        raise SourceError(f"adapter {folder} has no {ADAPTER_WEIGHTS}", hint=_SAVE_HINT)
    config = read_json_object(config_path, hint=_SAVE_HINT)
    if str(config.get("peft_type", "")).upper() != "LORA":
        raise SourceError(
            f"adapter {folder} is a {config.get('peft_type') or 'untyped'} adapter; ftx merges LoRA adapters only",
            hint='train a LoRA adapter (peft_type "LORA" in adapter_config.json), or merge it yourself and '
            "run the merged checkpoint",
        )
    return config


def lora_deltas(folder: Path) -> list[LoraDelta]:
    """The base weights the adapter changes, from its safetensors header (no tensor read)."""
    from ftx_triton.formats.checkpoint import SafetensorsFile

    reader = SafetensorsFile(folder / ADAPTER_WEIGHTS)
    try:
        shapes = {name: reader.shape(name) for name in reader.names()}
    finally:
        reader.close()
    deltas = []
    for name, a_shape in shapes.items():
        if ".lora_A." not in name:
            continue
        module = name.split(".lora_A.", 1)[0].removeprefix("base_model.model.")
        b_shape = shapes.get(name.replace(".lora_A.", ".lora_B."))
        if b_shape is None or len(a_shape) != 2 or len(b_shape) != 2 or a_shape[0] != b_shape[1]:
            raise SourceError(
                f"adapter {folder}: {name} has no matching lora_B of rank {a_shape[0]}",
                hint="the adapter file is damaged or not written by peft; save it again",
            )
        deltas.append(LoraDelta(f"{module}.weight", a_shape[0], (b_shape[0], a_shape[1])))
    if not deltas:
        raise SourceError(f"adapter {folder}: {ADAPTER_WEIGHTS} holds no LoRA weights (lora_A/lora_B)", hint=_SAVE_HINT)
    return deltas


def check_adapter_fits(folder: Path, base: Path, deltas: list[LoraDelta]) -> None:
    """Every module the adapter changes exists in the base checkpoint with the trained shape."""
    from ftx_triton.formats.checkpoint import open_checkpoint

    reader = open_checkpoint(base)
    try:
        shapes = {name: reader.shape(name) for name in reader.names()}
    finally:
        reader.close()
    for delta in deltas:
        have = shapes.get(delta.weight)
        if have is None:
            raise SourceError(
                f"adapter {folder} changes {delta.weight}, which the base checkpoint {base} does not have: "
                "it was trained for another model",
                hint="use the adapter with the base model it was trained on (adapter_config.json names it "
                "as base_model_name_or_path)",
            )
        if tuple(have) not in (delta.shape, delta.shape[::-1]):  # Conv1D-style bases store (in, out)
            raise SourceError(
                f"adapter {folder} expects {delta.weight} of shape {list(delta.shape)}, the base checkpoint "
                f"{base} has {list(have)}: it was trained for another size of model",
                hint="use the adapter with the base model it was trained on (adapter_config.json names it "
                "as base_model_name_or_path)",
            )


def merge_adapter(family: Family, base: Path, adapter: Path, dest: Path) -> None:
    """Write the base checkpoint with the adapter merged into its weights (safetensors) to ``dest``; the
    base's other files (tokenizer, generation config) are copied beside them."""
    import torch
    import transformers
    from peft import PeftModel

    config = transformers.AutoConfig.from_pretrained(base, local_files_only=True)
    class_name = family.hf_model_class or next(iter(getattr(config, "architectures", None) or ()), "")
    model_class = getattr(transformers, class_name, None)
    if model_class is None:
        raise CheckpointError(
            f"cannot merge an adapter into {base}: transformers has no model class {class_name!r}",
            hint="set hf_model_class on the family, or merge the adapter yourself and run the merged checkpoint",
        )
    with torch.no_grad():
        model = model_class.from_pretrained(base, local_files_only=True, **_dtype_auto())
        merged = PeftModel.from_pretrained(model, adapter, is_trainable=False).merge_and_unload()
        merged.save_pretrained(dest, safe_serialization=True)
    for entry in base.iterdir():
        if entry.is_file() and not entry.name.endswith(_WEIGHT_SUFFIXES) and not (dest / entry.name).exists():
            shutil.copy2(entry, dest / entry.name)


def adapter_origin(config: Mapping[str, Any]) -> dict[str, Any]:
    """What the merged checkpoint's provenance says about the adapter (rank, targets, the base it names)."""
    keys = ("r", "lora_alpha", "target_modules", "base_model_name_or_path")
    return {key: config.get(key) for key in keys if isinstance(config.get(key), str | int | float | list)}


def _dtype_auto() -> dict[str, str]:
    """from_pretrained's keyword that keeps the checkpoint's own dtype (``dtype`` since transformers 4.56)."""
    import transformers
    from packaging.version import Version

    return {"dtype": "auto"} if Version(transformers.__version__) >= Version("4.56") else {"torch_dtype": "auto"}


__all__ = [
    "ADAPTER_PATTERNS",
    "MERGE_VERSION",
    "LoraDelta",
    "adapter_origin",
    "check_adapter_fits",
    "check_adapter_folder",
    "lora_deltas",
    "merge_adapter",
]
