"""The Family base class: what a model-family plugin declares.

A family is mostly data: a tensor table, ``spec()`` (FT hyper-parameters from config.json), its
config.ini declaration (``ini``, see :mod:`ftx_triton.conversion.ftini`), the Triton model type's facts (I/O kind,
compute types, GEMM tool), presets. Core owns everything else (reading, splitting, writing,
caching, serving).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ftx_triton.conversion import ftini
from ftx_triton.conversion.tensormap import TensorMap
from ftx_triton.errors import CheckpointError, ConfigError, FtxError
from ftx_triton.io.jsonfile import read_json_object

if TYPE_CHECKING:  # the readers (numpy) are imported where weights are opened: not on a cached convert or run
    from ftx_triton.formats.reader import TensorReader

SLUG = re.compile(r"^[a-z][a-z0-9]*$")

DEFAULT_FETCH_PATTERNS: tuple[str, ...] = (
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "*.model",
    "added_tokens.json",
)
"""Files a Hugging Face family needs; .bin weights are fetched only when no safetensors exist."""

TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "spiece.model",
)


@dataclass(frozen=True)
class BuiltinModel:
    """A model ftx builds offline at first use (a preset whose source is ``builtin:NAME``), declared by its family.

    ``build(dest)`` writes a Hugging Face checkpoint into the empty directory ``dest`` and returns a JSON-able
    mapping recorded beside it (its final loss …). Core builds it once per ``FTX_HOME`` under a lock and
    publishes it by one rename; a build whose ``version`` or ``recipe`` differs from the recorded one is rebuilt.
    """

    build: Callable[[Path], Mapping[str, Any]]
    recipe: Mapping[str, Any]
    version: int = 1
    about: str = ""
    """What it is, for the record and the status line (``trains a tiny GPT-J offline, about 10 s``)."""


@dataclass(frozen=True)
class Preset:
    """A named model: its default source, revision, licence and an optional archive checksum."""

    source: str
    revision: str | None = None
    description: str = ""
    license: str | None = None
    sha256: str | None = None
    hf_config: Mapping[str, Any] | None = None
    """A copy of the model's config.json, so ``--dry-run`` can plan without a download."""
    builtin: BuiltinModel | None = None
    """How a ``builtin:NAME`` source is built (the family's recipe); None for every other source."""


@dataclass(frozen=True)
class ModelSpec:
    """FasterTransformer hyper-parameters of one checkpoint.

    ``dims`` names sizes used in table shapes (``H``, ``N``, ``D``, ``I``, ``V`` …);
    ``layers`` binds table placeholders (``{"i": 28}``); ``tp_divisible`` lists the dims that
    every tensor-parallel size must divide (heads, inner size).
    """

    dims: Mapping[str, int]
    layers: Mapping[str, int]
    start_id: int
    end_id: int
    pad_id: int | None = None
    tp_divisible: tuple[str, ...] = ("N", "I")
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for dim, value in self.dims.items():
            if not _positive_int(value):
                raise CheckpointError(
                    f"the model config gives {DIM_NAMES.get(dim, 'size')} {dim} = {value!r}; it must be an integer "
                    "above 0",
                    hint=_SPEC_HINT,
                )
        for name, count in self.layers.items():
            if not _positive_int(count):
                raise CheckpointError(
                    f"the model config gives layer count {{{name}}} = {count!r}; it must be an integer above 0",
                    hint=_SPEC_HINT,
                )
        for role, token in (("start", self.start_id), ("end", self.end_id), ("pad", self.pad_id)):
            if not (token is None and role == "pad") and not (_positive_int(token) or token == 0):
                raise CheckpointError(
                    f"the model config gives {role} token id {token!r}; it must be an integer >= 0", hint=_SPEC_HINT
                )

    def check_parallel(self, tp: int, pp: int) -> None:
        """Refuse a tp/pp that FasterTransformer cannot split this model for."""
        if tp < 1 or pp < 1:
            raise ConfigError(f"--tp and --pp must be at least 1 (got tp={tp}, pp={pp})")
        for dim in self.tp_divisible:
            if self.dims[dim] % tp:
                raise ConfigError(
                    f"{DIM_NAMES.get(dim, dim)} = {self.dims[dim]} is not divisible by --tp {tp}",
                    hint=f"use a --tp that divides {self.dims[dim]}",
                )
        for name, count in self.layers.items():
            if count % pp:
                raise ConfigError(
                    f"the layer count {count} ({{{name}}}) is not divisible by --pp {pp}",
                    hint=f"use a --pp that divides {count}",
                )

    def as_dict(self) -> dict[str, Any]:
        return {
            "dims": dict(self.dims),
            "layers": dict(self.layers),
            "start_id": self.start_id,
            "end_id": self.end_id,
            "pad_id": self.pad_id,
            "extra": dict(self.extra),
        }


_SPEC_HINT = "config.json is corrupt or does not belong to these weights; fetch the checkpoint again"


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def head_size_of(width: int, heads: int, width_key: str, heads_key: str) -> int:
    """``width // heads`` for a model whose heads split its width exactly (FT multiplies them back)."""
    if width > 0 and heads > 0 and width % heads:  # sizes not above 0 are ModelSpec's to refuse
        raise CheckpointError(
            f"the model config gives {width_key} = {width}, not a multiple of {heads_key} = {heads}", hint=_SPEC_HINT
        )
    return width // heads  # a head count of 0 raises here, and the spec wrapper names its key


def checked_rotary(rotary: int, head_size: int, key: str) -> int:
    """The rotary dimensions of a head: even, from 0 to the head size (rotations turn pairs of them)."""
    if head_size > 0 and (not 0 <= rotary <= head_size or rotary % 2):
        raise CheckpointError(
            f"the model config gives {key} = {rotary} rotary dimensions; it must be an even number "
            f"from 0 to the head size {head_size}",
            hint=_SPEC_HINT,
        )
    return rotary


DIM_NAMES = {"N": "head count", "I": "inner (FFN) size", "H": "hidden size", "V": "vocab size", "A": "attention width"}


class Family:
    """Base class of every model family. Subclasses set the class attributes and ``spec``."""

    name: ClassVar[str]
    title: ClassVar[str] = ""
    hf_model_types: ClassVar[tuple[str, ...]] = ()
    hf_architectures: ClassVar[tuple[str, ...]] = ()
    presets: ClassVar[Mapping[str, Preset]] = {}
    tensors: ClassVar[TensorMap]
    ini: ClassVar[ftini.FtIni] = ftini.NO_INI
    """config.ini: sections and keys written, Hugging Face fields read back (:class:`ftx_triton.conversion.ftini.FtIni`)."""
    # -- facts of the Triton model type (config.pbtxt model_type) that serves the family --
    triton_model_type: ClassVar[str]
    triton_io: ClassVar[str] = "decoder"
    """``decoder`` (GPT-J/NeoX inputs) or ``encoder-decoder`` (T5 inputs)."""
    ft_output_dtypes: ClassVar[Mapping[str, str]] = {}
    """Outputs the model type returns in another dtype than its I/O kind's table says (Triton
    forwards the backend's own dtype, and an ensemble step refuses a dtype it did not declare)."""
    weight_dtypes: ClassVar[tuple[str, ...]] = ("fp32", "fp16", "bf16")
    data_types: ClassVar[tuple[str, ...]] = ("fp32", "fp16", "bf16")
    """Compute types FasterTransformer really runs for this model type."""
    data_type_note: ClassVar[str] = ""
    """Why another compute type is refused, when there is more to say than the list."""
    gemm_tool: ClassVar[str] = "gpt_gemm"
    fetch_patterns: ClassVar[tuple[str, ...]] = DEFAULT_FETCH_PATTERNS
    license: ClassVar[str | None] = None
    # -- tokenizer and runtime declarations (configure, python runtime) --
    tokenizer_files: ClassVar[tuple[str, ...]] = TOKENIZER_FILES
    """Files copied from the source (or --tokenizer) into the repository's pre/post-processing models."""
    tokenizer_kind: ClassVar[str] = "hf"
    """``hf`` (tokenizers.Tokenizer from tokenizer.json) or ``sentencepiece`` (spiece.model)."""
    special_tokens: ClassVar[Mapping[str, str]] = {}
    """Token strings whose ids must match the spec, e.g. ``{"bos": "[BOS]", "eos": "[EOS]", "pad": "[PAD]"}``."""
    hf_model_class: ClassVar[str] = ""
    """transformers class the python runtime rebuilds (``GPTJForCausalLM``)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name")
        if name is not None and not SLUG.match(name):
            raise TypeError(f"family name {name!r} must be a lowercase slug like 'gptj'")
        if "spec" in cls.__dict__:  # every family's config reading fails with error/hint, never a traceback
            cls.spec = _checked_spec(cls.__dict__["spec"])  # type: ignore[method-assign]

    # -- what a family must provide -------------------------------------------------------

    def spec(self, hf_config: Mapping[str, Any]) -> ModelSpec:
        """FT hyper-parameters from a Hugging Face config.json."""
        raise NotImplementedError

    def tensor_map(self, spec: ModelSpec) -> TensorMap:
        """The table for one checkpoint: ``tensors``, unless a family's rows depend on its config
        (T5: gated or plain FFN, tied or separate LM head) and it overrides this."""
        return self.tensors

    def config_ini(self, spec: ModelSpec, hf_config: Mapping[str, Any], weight_dtype: str) -> dict[str, dict[str, Any]]:
        """The ``config.ini`` sections for the converted checkpoint, from ``ini`` (a hook for the exotic)."""
        return ftini.config_sections(self, spec, hf_config, weight_dtype)

    def hf_config_from_ini(self, ini: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
        """A Hugging Face config dict rebuilt from ``config.ini`` by ``ini.hf_fields`` (used by the python runtime)."""
        return ftini.hf_config_from_ini(self, ini)

    def spec_from_ini(self, ini: Mapping[str, Mapping[str, str]]) -> ModelSpec:
        """The spec of a converted checkpoint, from its config.ini."""
        return self.spec(self.hf_config_from_ini(ini))

    def gemm_args(
        self, spec: ModelSpec, *, batch: int, beam: int, max_input_len: int, data_type: str, tp: int
    ) -> list[str]:
        """Arguments of the GEMM tool (``gpt_gemm``'s order by default)."""
        code = {"fp32": 0, "fp16": 1, "bf16": 2}[data_type]
        d = spec.dims
        return [str(v) for v in (batch, beam, max_input_len, d["N"], d["D"], d["I"], d["V"], code, tp)]

    # -- defaults a family may override ----------------------------------------------------

    def read_hf_config(self, path: Path) -> dict[str, Any]:
        """Read config.json of a source directory."""
        return read_config_json(path)

    def open_weights(self, path: Path) -> TensorReader:
        """Open the source weights lazily."""
        from ftx_triton.formats.checkpoint import open_checkpoint

        return open_checkpoint(path)

    def claims_source(self, path: Path) -> bool:
        """Whether a source directory is in a format only this family reads (no config.json)."""
        return False

    def matches(self, hf_config: Mapping[str, Any]) -> bool:
        """Whether this family claims a config.json (by model_type or architecture)."""
        if hf_config.get("model_type") in self.hf_model_types:
            return True
        return any(a in self.hf_architectures for a in hf_config.get("architectures") or ())

    def check_weight_dtype(self, weight_dtype: str) -> None:
        if weight_dtype not in self.weight_dtypes:
            raise ConfigError(
                f"family {self.name} cannot store weights as {weight_dtype}",
                hint=f"use --weight-dtype {' or '.join(self.weight_dtypes)}",
            )

    fingerprint_modules: ClassVar[tuple[str, ...]] = ()
    """Modules whose code shapes the converted bytes besides the table (e.g. a custom checkpoint reader)."""

    def fingerprint(self) -> str:
        """Digest of what shapes the converted files: the table, its ops, ``spec``, the config.ini
        declaration (``ini``, its functions, a ``config_ini`` override), the readers, and
        ``fingerprint_modules``. Not the version: an upgrade that changes none of these reuses cached
        conversions."""
        parts = [self.tensors.digest(), self.ini.digest()]
        funcs: list[Any] = [
            getattr(type(self), m) for m in ("spec", "config_ini", "read_hf_config", "open_weights", "tensor_map")
        ]
        funcs += self.ini.functions()
        for row in self.tensors.rows:
            funcs += [row.op.forward, row.op.shape, row.op.inverse]
        parts += [_source_of(f) for f in funcs if f is not None]
        parts += [_source_of(importlib.import_module(m)) for m in self.fingerprint_modules]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _source_of(obj: Any) -> str:
    """``obj``'s source text, remembered per object: every stage key of a run asks for the same few hundred
    functions' text (tokenizing them again took ~10 ms a key)."""
    try:
        return _remembered_source(obj)
    except TypeError:  # unhashable: not remembered
        return _read_source(obj)


def _read_source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return getattr(obj, "__qualname__", repr(obj))


_remembered_source = functools.lru_cache(maxsize=None)(_read_source)


def read_config_json(path: Path) -> dict[str, Any]:
    """Load ``config.json`` from a checkpoint directory with a clear error."""
    try:
        return read_json_object(
            path / "config.json",
            hint="config.json must be the model's configuration (a JSON object); fetch the checkpoint again",
        )
    except FileNotFoundError:
        raise CheckpointError(
            f"{path} has no config.json", hint="point at a Hugging Face checkpoint directory (config.json + weights)"
        ) from None


POSITION_KEYS = ("n_positions", "max_position_embeddings", "n_ctx", "max_sequence_length")
"""config.json keys that give a decoder's context size (prompt + generated tokens)."""


class _ConfigFloat(float):
    """A float read from config.json: ``int()`` of it refuses a fraction (``n_layer: 2.5`` is not 2 layers)."""

    def __int__(self) -> int:
        if not self.is_integer():
            raise ValueError(f"{float(self)!r} is not a whole number")
        return super().__int__()


class _ReadConfig(dict):
    """A config dict that remembers the last key read, to name the value a family's ``spec`` choked on;
    its floats refuse to become ints with a fraction."""

    last: str | None = None

    def __getitem__(self, key: str) -> Any:
        self.last = key
        return _strict(super().__getitem__(key))

    def get(self, key: str, default: Any = None) -> Any:
        self.last = key
        return _strict(super().get(key, default))


def _strict(value: Any) -> Any:
    return _ConfigFloat(value) if type(value) is float else value


def _check_positions(hf_config: Mapping[str, Any]) -> str | None:
    """What is wrong with a context size the config gives (``n_positions: 0`` serves nothing), or None."""
    for key in POSITION_KEYS:
        if key in hf_config and hf_config[key] is not None:
            value = hf_config[key]
            if not _positive_int(value):
                return f"{key} = {value!r} is not a positive whole number of positions"
    return None


_CONFIG_ERRORS = (KeyError, TypeError, ValueError, ZeroDivisionError, AttributeError, IndexError, OverflowError)


def _checked_spec(spec: Any) -> Any:
    """Wrap a family's ``spec``: a config value it cannot use becomes a CheckpointError naming the key."""

    @functools.wraps(spec)
    def checked(self: Family, hf_config: Mapping[str, Any]) -> ModelSpec:
        config = _ReadConfig(hf_config)
        try:
            if problem := _check_positions(hf_config):
                raise CheckpointError(
                    f"the model config (config.json) cannot be served: {problem}",
                    hint="fix config.json: the context size is the number of positions the "
                    "model was trained with (e.g. 2048)",
                )
            return spec(self, config)
        except FtxError:
            raise
        except _CONFIG_ERRORS as exc:
            if isinstance(exc, KeyError) and exc.args and exc.args[0] not in config:
                problem = f"it has no {exc.args[0]!r}"
            elif config.last is not None and config.last in config:
                problem = f"{config.last} = {config[config.last]!r} cannot be used ({type(exc).__name__}: {exc})"
            else:
                problem = f"{type(exc).__name__}: {exc}"
            model_type = hf_config.get("model_type")
            raise CheckpointError(
                f"the model config (config.json) does not describe a {self.name} model: {problem}",
                hint=f"check that config.json belongs to these weights and the --family (its model_type is "
                f"{model_type!r}; `ftx models` lists the families)",
            ) from exc

    return checked
