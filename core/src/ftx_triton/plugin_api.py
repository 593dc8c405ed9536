"""The API a model-family plugin imports: everything its ``Family`` subclass, tensor table and config.ini
declaration are written with, from one module that stays put when core's packages move.

A family plugin imports this module (and ``hookimpl`` from ``ftx_triton``) and nothing else of ftx: an
import-linter contract in the root ``pyproject.toml`` keeps core's four plugins to it. The plugin's package
``__init__`` should import its family module inside ``ftx_register_families`` (this module imports numpy;
``ftx --help`` loads the plugins but needs no family). Runtimes use ``ftx_triton.Runtime`` and
``ftx_triton.commandkit`` (docs/writing-a-runtime.md). ``tiny`` (:mod:`ftx_triton.tiny`) is what a family's tiny
checkpoints and built-in models (a ``Preset`` with a ``BuiltinModel``) are made of: corpus, tokenizers, seeded
weights, a short deterministic training.
"""

from __future__ import annotations

from ftx_triton import hookimpl, tiny
from ftx_triton.conversion import ops
from ftx_triton.conversion.family import (
    BuiltinModel,
    Family,
    ModelSpec,
    Preset,
    checked_rotary,
    head_size_of,
    read_config_json,
)
from ftx_triton.conversion.ftini import ROTARY_GPT_KEYS, FtIni, IniSection, Key
from ftx_triton.conversion.ops import Op, OpContext, Shape
from ftx_triton.conversion.tensormap import M, Skip, TensorMap
from ftx_triton.conversion.tokenizer_ids import reconcile_token_ids
from ftx_triton.errors import CheckpointError, ConfigError
from ftx_triton.formats.reader import TensorReader

__all__ = [
    "BuiltinModel",
    "CheckpointError",
    "ConfigError",
    "Family",
    "FtIni",
    "IniSection",
    "Key",
    "M",
    "ModelSpec",
    "Op",
    "OpContext",
    "Preset",
    "ROTARY_GPT_KEYS",
    "Shape",
    "Skip",
    "TensorMap",
    "TensorReader",
    "checked_rotary",
    "head_size_of",
    "hookimpl",
    "ops",
    "read_config_json",
    "reconcile_token_ids",
    "tiny",
]
