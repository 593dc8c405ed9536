"""FasterTransformer's ``config.ini`` vocabulary, defined once, and the one writer and reader.

Like llama.cpp's gguf-py constants: every key is a :class:`Key` in :data:`KEYS` (name, type,
meaning, the checkpoint quantity it holds, what a reader assumes when it is absent). A family
declares data only, an :class:`FtIni`: its sections (which keys, in which order, fixed values) and
the Hugging Face config fields its quantities map back to. :func:`config_sections` writes the
sections of a checkpoint; :func:`hf_config_from_ini` reads them back (for the python runtime and
for re-deriving a spec from a converted directory).

Quantities are one flat namespace per checkpoint: the spec's dims (``H``, ``N``, ``D``, ``I``,
``V`` …), its layer counts by placeholder (``i``; T5: ``e``, ``d``), ``start_id``, ``end_id``,
``pad_id``, its ``extra`` keys, ``weight_dtype`` and ``name``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ftx_triton.errors import CheckpointError, PluginError

if TYPE_CHECKING:
    from ftx_triton.conversion.family import Family, ModelSpec


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""A key's default when a reader cannot go on without it (FasterTransformer exits)."""

LAYERS = "<layers>"
"""A key's source meaning "the layer count of this section" (:attr:`IniSection.layers`)."""

_TRUE, _FALSE = frozenset({"true", "yes", "on", "1"}), frozenset({"false", "no", "off", "0"})
_KINDS = {int: "an integer", float: "a number", str: "text", bool: "a boolean"}


@dataclass(frozen=True)
class Key:
    """One config.ini key: what it means and which quantity of the checkpoint it holds."""

    name: str
    type: type
    """``int``, ``float``, ``str`` or ``bool`` (written ``true``/``false``)."""
    meaning: str
    source: str | None = None
    """The quantity it holds (``"N"``, ``"start_id"``, an extra key, :data:`LAYERS`); None: a section's fixed value."""
    default: Any = REQUIRED
    """What a reader assumes when the key is absent; None: the quantity stays unknown."""

    def __post_init__(self) -> None:
        if self.type not in _KINDS:
            raise TypeError(f"config.ini key {self.name}: type must be int, float, str or bool, not {self.type!r}")


def _keys(*keys: Key) -> dict[str, Key]:
    return {k.name: k for k in keys}


KEYS: Mapping[str, Key] = _keys(
    # -- GPT-style decoders ([gptj], [gptneox], [gpt]): FasterTransformer's Triton model classes
    Key("model_name", str, "model name (FT requires one; any value)", "name", None),
    Key("head_num", int, "attention heads", "N"),
    Key("size_per_head", int, "head size", "D"),
    Key("inter_size", int, "FFN inner size", "I"),
    Key("num_layer", int, "decoder layers", LAYERS),
    Key("rotary_embedding", int, "rotary dimensions per head", "rotary_embedding"),
    Key("max_pos_seq_len", int, "learned positions", "P"),
    Key("vocab_size", int, "vocabulary size", "V"),
    Key("start_id", int, "first token id", "start_id"),
    Key("end_id", int, "end-of-sequence id", "end_id"),
    Key("use_gptj_residual", int, "1: parallel (GPT-J style) residual, 0: sequential", "use_gptj_residual", 1),
    Key("layernorm_eps", float, "layernorm epsilon", "layernorm_eps"),
    # -- every model: the element type of all .bin files (the loader reads it)
    Key("weight_data_type", str, "fp32, fp16 or bf16: the element type of every .bin file", "weight_dtype"),
    # -- T5 [encoder] / [decoder] (the Triton T5 model; FT's PyTorch T5 examples read a few more)
    Key("_name_or_path", str, "model name (FT requires one; any value)", "name", None),
    Key("model_type", str, "Hugging Face model_type (FT's T5 examples)"),
    Key("num_heads", int, "attention heads", "N"),
    Key("d_kv", int, "head size", "D"),
    Key("d_model", int, "hidden size", "H"),
    Key("d_ff", int, "FFN inner size", "I"),
    Key("num_layers", int, "blocks of this stack", LAYERS),
    Key("num_decoder_layers", int, "decoder blocks (FT's T5 examples)", "d"),
    Key("relative_attention_num_buckets_or_max_pos_seq_len", int, "relative-attention buckets", "B"),
    Key(
        "relative_attention_max_distance",
        int,
        "relative-attention distance (FT hard-codes 128)",
        "relative_attention_max_distance",
        128,
    ),
    Key("feed_forward_proj", str, "FFN activation (relu, gated-gelu …)", "feed_forward_proj", "relu"),
    Key("is_gated_act", bool, "gated FFN (FT's T5 examples)", "gated", False),
    Key("layer_norm_epsilon", float, "RMS-norm epsilon (FT hard-codes 1e-6)", "layer_norm_epsilon", 1e-6),
    Key(
        "tie_word_embeddings", bool, "LM head tied to the embedding (rescales the output)", "tie_word_embeddings", True
    ),
    Key("decoder_start_token_id", int, "first decoder token id", "start_id"),
    Key("eos_token_id", int, "end-of-sequence id", "end_id"),
    Key("pad_token_id", int, "padding id (FT's T5 examples)", "pad_id", None),
    # -- T5 [structure]
    Key("t5_with_bias", bool, "linear and layernorm biases", default=False),
    Key("use_gated_activation", bool, "gated FFN (wi and wi2)", "gated", False),
    Key("position_embedding_type", str, "relative, or anything else for absolute", default="relative"),
)
"""Every config.ini key a family may use, by name."""

ROTARY_GPT_KEYS = (
    "model_name",
    "head_num",
    "size_per_head",
    "inter_size",
    "num_layer",
    "rotary_embedding",
    "vocab_size",
    "start_id",
    "end_id",
)
"""The keys FasterTransformer's rotary decoders (``[gptj]``, ``[gptneox]``) share, in upstream's order;
a family's section adds its own after them (``weight_data_type`` last)."""


@dataclass(frozen=True)
class IniSection:
    """One config.ini section of a family: canonical key names (or the family's own :class:`Key`) in order."""

    name: str
    keys: tuple[str | Key, ...]
    layers: str = "i"
    """The layer placeholder :data:`LAYERS` keys count (T5: ``e`` for the encoder, ``d`` for the decoder)."""
    values: Mapping[str, Any] = field(default_factory=dict)
    """Fixed values, for keys whose value is not a quantity of the checkpoint."""
    required: bool = True
    """FasterTransformer needs the section (T5's ``[structure]`` has defaults for every key)."""

    def __post_init__(self) -> None:
        resolved = self.resolved()
        names = [k.name for k in resolved]
        if len(set(names)) != len(names):
            raise TypeError(f"config.ini section [{self.name}] lists a key twice: {names}")
        for key in resolved:
            if key.source is None and key.name not in self.values:
                raise TypeError(f"config.ini key [{self.name}] {key.name} has no source: give it in values=")
        stray = set(self.values) - set(names)
        if stray:
            raise TypeError(f"values= of section [{self.name}] name keys it does not list: {sorted(stray)}")

    def resolved(self) -> tuple[Key, ...]:
        """The section's keys, names looked up in :data:`KEYS`."""
        out = []
        for key in self.keys:
            if isinstance(key, Key):
                out.append(key)
            elif key in KEYS:
                out.append(KEYS[key])
            else:
                raise TypeError(
                    f"config.ini section [{self.name}]: unknown key {key!r}; declare it as a Key "
                    f"or use one of {', '.join(KEYS)}"
                )
        return tuple(out)

    def source_of(self, key: Key) -> str | None:
        return self.layers if key.source == LAYERS else key.source


HfField = str | Callable[[Mapping[str, Any]], Any]
"""A quantity name, or a function of all quantities (``lambda q: q["rotary_embedding"] / q["D"]``)."""


@dataclass(frozen=True)
class FtIni:
    """A family's config.ini: sections to write, and how to read a Hugging Face config back."""

    sections: tuple[IniSection, ...]
    hf_fields: Mapping[str, HfField] = field(default_factory=dict)
    """Hugging Face config field -> quantity (or function of the quantities); unknown ones are left out."""
    hf_constants: Mapping[str, Any] = field(default_factory=dict)
    """Fields config.ini does not carry (``model_type``, what FT hard-codes)."""
    model_name: str | None = None
    """The name written when config.json has no ``_name_or_path`` (default: the family's name)."""

    def required_sections(self) -> tuple[str, ...]:
        """Sections FasterTransformer reads and cannot do without."""
        return tuple(s.name for s in self.sections if s.required)

    def digest(self) -> str:
        """The declaration as text (functions by name; a family's fingerprint adds their source)."""
        sections = [
            {
                "name": s.name,
                "layers": s.layers,
                "required": s.required,
                "values": {k: repr(v) for k, v in s.values.items()},
                "keys": [[k.name, k.type.__name__, k.source, repr(k.default)] for k in s.resolved()],
            }
            for s in self.sections
        ]
        fields = {
            k: v if isinstance(v, str) else getattr(v, "__qualname__", repr(v)) for k, v in self.hf_fields.items()
        }
        return json.dumps(
            {
                "sections": sections,
                "hf_fields": fields,
                "model_name": self.model_name,
                "hf_constants": {k: repr(v) for k, v in self.hf_constants.items()},
            },
            sort_keys=True,
        )

    def functions(self) -> list[Callable[..., Any]]:
        return [v for v in self.hf_fields.values() if callable(v)]


NO_INI = FtIni(sections=())


def _name(family: Family, hf_config: Mapping[str, Any] | None = None) -> str:
    return str((hf_config or {}).get("_name_or_path") or family.ini.model_name or family.name)


def quantities(family: Family, spec: ModelSpec, hf_config: Mapping[str, Any], weight_dtype: str) -> dict[str, Any]:
    """Every quantity a key may hold, for one checkpoint."""
    return {
        **spec.dims,
        **spec.layers,
        **spec.extra,
        "start_id": spec.start_id,
        "end_id": spec.end_id,
        "pad_id": spec.pad_id,
        "weight_dtype": weight_dtype,
        "name": _name(family, hf_config),
    }


def config_sections(
    family: Family, spec: ModelSpec, hf_config: Mapping[str, Any], weight_dtype: str
) -> dict[str, dict[str, Any]]:
    """``{section: {key: value}}`` of a converted checkpoint, in the family's order."""
    if not family.ini.sections:
        raise PluginError(
            f"family {family.name} declares no config.ini sections",
            hint="set ini = FtIni(sections=(IniSection(...), ...)) on the family (see ftx_triton.conversion.ftini)",
        )
    q = quantities(family, spec, hf_config, weight_dtype)
    out: dict[str, dict[str, Any]] = {}
    for section in family.ini.sections:
        values: dict[str, Any] = {}
        for key in section.resolved():
            source = section.source_of(key)
            if key.name in section.values:
                value = section.values[key.name]
            else:
                value = q.get(source) if source else None
            if value is None and key.default is None:
                continue  # an optional key with nothing to say
            _check_type(family, section, key, source, value)
            values[key.name] = value
        out[section.name] = values
    return out


def _is_a(value: Any, kind: type) -> bool:
    if kind is bool or isinstance(value, bool):
        return kind is bool and isinstance(value, bool)
    if kind is float:
        return isinstance(value, int | float)
    return isinstance(value, kind)


def _check_type(family: Family, section: IniSection, key: Key, source: str | None, value: Any) -> None:
    if not _is_a(value, key.type):
        raise PluginError(
            f"family {family.name}: config.ini [{section.name}] {key.name} needs {_KINDS[key.type]}, "
            f"but {f'quantity {source!r}' if source else 'its value'} is {value!r}",
            hint="fix the family's spec() or its ini declaration",
        )


def parse_bool(text: str) -> bool | None:
    """A boolean as FasterTransformer's INI reader parses it; None when it is not one."""
    value = text.strip().lower()
    return True if value in _TRUE else False if value in _FALSE else None


def _parse(key: Key, section: str, text: str) -> Any:
    if key.type is bool:
        parsed = parse_bool(text)
        if parsed is None and key.default in (REQUIRED, None):
            raise CheckpointError(
                f"config.ini [{section}] {key.name} = {text!r} is not a boolean",
                hint="use true or false, or convert the checkpoint again",
            )
        return key.default if parsed is None else parsed  # FT's GetBoolean: anything else is the default
    try:
        return key.type(text.strip())
    except ValueError:
        raise CheckpointError(
            f"config.ini [{section}] {key.name} = {text!r} is not {_KINDS[key.type]}",
            hint="fix config.ini or convert the checkpoint again",
        ) from None


def read_quantities(family: Family, ini: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    """The quantities a config.ini states, checked for agreement between sections, defaults filled in."""
    found: dict[str, tuple[Any, str]] = {}
    defaults: dict[str, Any] = {}
    missing: list[tuple[str, str]] = []
    for section in family.ini.sections:
        if section.name not in ini:
            if section.required:
                raise CheckpointError(
                    f"config.ini has no [{section.name}] section (it has {', '.join(ini) or 'none'})",
                    hint=f"this is not a {family.name} checkpoint; convert it with --family {family.name}",
                )
            values: Mapping[str, str] = {}
        else:
            values = ini[section.name]
        for key in section.resolved():
            source = section.source_of(key)
            if source is None or key.name in section.values:
                continue
            if key.name not in values:
                if key.default is REQUIRED:
                    missing.append((f"[{section.name}] {key.name}", source))
                elif key.default is not None:
                    defaults.setdefault(source, key.default)
                continue
            value = _parse(key, section.name, values[key.name])
            where = f"[{section.name}] {key.name}"
            if source in found and found[source][0] != value:
                raise CheckpointError(
                    f"config.ini disagrees with itself: {found[source][1]} = {found[source][0]!r} "
                    f"but {where} = {value!r}",
                    hint="fix config.ini or convert the checkpoint again",
                )
            found.setdefault(source, (value, where))
    q = {**defaults, **{name: value for name, (value, _) in found.items()}}
    unresolved = [where for where, source in missing if source not in q]  # another section may state it
    if unresolved:
        raise CheckpointError(
            f"config.ini has no {', '.join(unresolved)}",
            hint="FasterTransformer cannot load it either; convert the checkpoint again",
        )
    q.setdefault("name", _name(family))
    if "H" not in q and "N" in q and "D" in q:
        q["H"] = q["N"] * q["D"]  # FT's hidden size is heads x head size
    return q


def hf_config_from_ini(family: Family, ini: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    """A Hugging Face config dict rebuilt from config.ini by the family's ``ini.hf_fields``."""
    q = read_quantities(family, ini)
    config: dict[str, Any] = dict(family.ini.hf_constants)
    if family.hf_model_class:
        config.setdefault("architectures", [family.hf_model_class])
    for name, source in family.ini.hf_fields.items():
        value = source(q) if callable(source) else q.get(source)
        if value is not None:
            config[name] = value
    return config
