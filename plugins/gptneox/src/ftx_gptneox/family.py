"""GPT-NeoX (EleutherAI GPT-NeoX-20B, Pythia, h2oGPT): tensor table and FT hyper-parameters.

Differences from upstream's ``huggingface_gptneox_convert.py``, each shown by a test:

* Sequential residual (``use_parallel_residual: false``): FasterTransformer adds
  ``attention.dense.bias`` and ``mlp.dense_4h_to_h.bias`` once, *after* the all-reduce, so they are
  written as the full Hugging Face values. Upstream divides them by tp, which is wrong at tp > 1.
* Parallel residual: the loader reads only ``mlp.attention.bias.sum`` (each bias divided by tp,
  then summed, in the file dtype — byte-identical to upstream). The two separate bias files are
  never read in this mode (golden README rule 2); they hold the full values too, so that one file
  name means one thing for both residual kinds and the inverse recovers both biases exactly for
  any tp (upstream's copies are the full values divided by tp).
* bf16 weight files are allowed (upstream offers fp32/fp16 only): FT's NeoX loader reads every
  file through ``getModelFileType(config.ini, "gptneox")`` and ``loadWeightFromBin<T>``, whose
  BF16 case converts into the fp32 or fp16 compute buffers (compiled whenever CUDA >= 11, which
  every FasterTransformer Triton image uses). The *compute* type stays fp32 or fp16
  (``data_types``): FT instantiates GPT-NeoX for float and half only.
* A rotary base other than 10000 or a ``rope_scaling`` is refused: FT hard-codes base 10000 and
  has no scaling, so it would silently compute a different model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ftx_triton.plugin_api import (
    ROTARY_GPT_KEYS,
    ConfigError,
    Family,
    FtIni,
    IniSection,
    Key,
    M,
    ModelSpec,
    Op,
    OpContext,
    Preset,
    Shape,
    Skip,
    TensorMap,
    checked_rotary,
    head_size_of,
    ops,
)

if TYPE_CHECKING:
    import numpy as np

# -- ops: Hugging Face's head-interleaved fused QKV <-> FT's [q | k | v] blocks ------------------


def _qkv_weight(xs: Sequence[np.ndarray], ctx: OpContext) -> np.ndarray:
    # HF rows [3H, in] are per head (q_h, k_h, v_h); FT wants [in, 3, H] with the heads of q, k, v
    # each contiguous, so a split of the last axis hands every rank whole heads.
    n, d = ctx.dims["N"], ctx.dims["D"]
    x = xs[0].T  # [in, 3H]
    return x.reshape(x.shape[0], n, 3, d).transpose(0, 2, 1, 3).reshape(x.shape[0], 3, n * d)


def _qkv_weight_inverse(y: np.ndarray, ctx: OpContext) -> list[np.ndarray]:
    n, d = ctx.dims["N"], ctx.dims["D"]
    x = y.reshape(y.shape[0], 3, n, d).transpose(0, 2, 1, 3).reshape(y.shape[0], 3 * n * d)
    return [x.T]


neox_qkv_weight = Op(
    "neox_qkv_weight",
    forward=_qkv_weight,
    shape=lambda shapes, ctx: (shapes[0][1], 3, shapes[0][0] // 3),
    inverse=_qkv_weight_inverse,
)
"""``[3H, H]`` head-interleaved (q, k, v per head) -> ``[H, 3, H]``; split the last axis."""


def _qkv_bias(xs: Sequence[np.ndarray], ctx: OpContext) -> np.ndarray:
    n, d = ctx.dims["N"], ctx.dims["D"]
    return xs[0].reshape(n, 3, d).transpose(1, 0, 2).reshape(3, n * d)


def _qkv_bias_inverse(y: np.ndarray, ctx: OpContext) -> list[np.ndarray]:
    n, d = ctx.dims["N"], ctx.dims["D"]
    return [y.reshape(3, n, d).transpose(1, 0, 2).reshape(3 * n * d)]


neox_qkv_bias = Op(
    "neox_qkv_bias", forward=_qkv_bias, shape=lambda shapes, ctx: (3, shapes[0][0] // 3), inverse=_qkv_bias_inverse
)
"""``[3H]`` head-interleaved -> ``[3, H]``; split the last axis."""


def _bias_sum(xs: Sequence[np.ndarray], ctx: OpContext) -> np.ndarray:
    # FT (parallel residual) adds this bias on every rank before the single all-reduce, so each
    # rank holds 1/tp of both biases. Computed like upstream, for byte parity: each bias rounded to
    # the file dtype, divided by tp and summed in the file dtype.
    attn, mlp = (x.astype(ctx.out_dtype) for x in xs)
    if ctx.tp > 1:
        import numpy as np  # here, not at the top: the plugin loads without numpy (a cached convert or run)

        tp = np.asarray(ctx.tp, dtype=ctx.out_dtype)
        attn, mlp = attn / tp, mlp / tp
    return (attn + mlp).astype(ctx.out_dtype)


def _same_shape(shapes: Sequence[Shape], ctx: OpContext) -> Shape:
    return tuple(shapes[0])


neox_bias_sum = Op("neox_bias_sum", forward=_bias_sum, shape=_same_shape, layout_only=False, arity=2)
"""``(attention.dense.bias + mlp.dense_4h_to_h.bias) / tp``; not invertible (the sources have their own files)."""


# -- the table ---------------------------------------------------------------------------------

L = "gpt_neox.layers.{i}"
FT = "model.layers.{i}"

# fmt: off
_ROWS = (
    #  Hugging Face source                          FasterTransformer file stem                  op / split / HF shape
    M("gpt_neox.embed_in.weight",                   "model.wte",                                  shape=("V", "H")),
    M(f"{L}.input_layernorm.weight",                f"{FT}.input_layernorm.weight",               shape=("H",)),
    M(f"{L}.input_layernorm.bias",                  f"{FT}.input_layernorm.bias",                 shape=("H",)),
    M(f"{L}.attention.query_key_value.weight",      f"{FT}.attention.query_key_value.weight",     neox_qkv_weight, -1,
      ("3*H", "H")),
    M(f"{L}.attention.query_key_value.bias",        f"{FT}.attention.query_key_value.bias",       neox_qkv_bias, -1, ("3*H",)),
    M(f"{L}.attention.dense.weight",                f"{FT}.attention.dense.weight",               ops.transpose, 0, ("H", "H")),
    # Full values: FT (sequential residual) adds them once after the all-reduce. Not read with the
    # parallel residual, where they let the inverse recover both biases exactly.
    M(f"{L}.attention.dense.bias",                  f"{FT}.attention.dense.bias",                 shape=("H",)),
    M(f"{L}.post_attention_layernorm.weight",       f"{FT}.post_attention_layernorm.weight",      shape=("H",)),
    M(f"{L}.post_attention_layernorm.bias",         f"{FT}.post_attention_layernorm.bias",        shape=("H",)),
    M(f"{L}.mlp.dense_h_to_4h.weight",              f"{FT}.mlp.dense_h_to_4h.weight",             ops.transpose, -1, ("I", "H")),
    M(f"{L}.mlp.dense_h_to_4h.bias",                f"{FT}.mlp.dense_h_to_4h.bias",               ops.identity, -1, ("I",)),
    M(f"{L}.mlp.dense_4h_to_h.weight",              f"{FT}.mlp.dense_4h_to_h.weight",             ops.transpose, 0, ("H", "I")),
    M(f"{L}.mlp.dense_4h_to_h.bias",                f"{FT}.mlp.dense_4h_to_h.bias",               shape=("H",)),
    M("gpt_neox.final_layer_norm.weight",           "model.final_layernorm.weight",               shape=("H",)),
    M("gpt_neox.final_layer_norm.bias",             "model.final_layernorm.bias",                 shape=("H",)),
    # No LM-head bias in NeoX; a tied checkpoint may store only the input embedding.
    M("embed_out.weight|gpt_neox.embed_in.weight",  "model.lm_head.weight",                       shape=("V", "H")),
    # Buffers, not weights: rotary frequencies (FT computes them, base 10000) and causal masks.
    Skip(f"{L}.attention.rotary_emb.inv_freq", "gpt_neox.rotary_emb.inv_freq",
         f"{L}.attention.bias", f"{L}.attention.masked_bias"),
)
# fmt: on

TENSORS_SEQUENTIAL = TensorMap(*_ROWS)
"""``use_parallel_residual: false`` (FT ``use_gptj_residual=0``)."""

TENSORS = TensorMap(
    *_ROWS,
    # FT reads this bias (and neither separate one) only with the parallel residual.
    M(
        (f"{L}.attention.dense.bias", f"{L}.mlp.dense_4h_to_h.bias"),
        f"{FT}.mlp.attention.bias.sum",
        neox_bias_sum,
        None,
        ("H",),
        invert=False,
    ),
)
"""``use_parallel_residual: true`` (FT ``use_gptj_residual=1``): every row of the sequential table
plus ``mlp.attention.bias.sum``. The family's ``tensors`` (and its fingerprint) is this superset."""

FT_ROTARY_BASE = 10000
ROTARY_PCT_DEFAULT = 0.25
"""``GPTNeoXConfig``'s default when config.json has neither ``rotary_pct`` nor ``partial_rotary_factor``."""


def _config(hidden: int, heads: int, inter: int, layers: int) -> dict[str, Any]:
    """config.json of a released GPT-NeoX checkpoint."""
    return {
        "model_type": "gpt_neox",
        "architectures": ["GPTNeoXForCausalLM"],
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "rotary_pct": 0.25,
        "rotary_emb_base": FT_ROTARY_BASE,
        "vocab_size": 50432,
        "max_position_embeddings": 2048,
        "use_parallel_residual": True,
        "layer_norm_eps": 1e-5,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "tie_word_embeddings": False,
    }


HIDDEN_ACT = Key(
    "hidden_act",
    str,
    "the checkpoint's activation: not read by FT (which always runs its tanh GELU); "
    "lets the python runtime rebuild the checkpoint's own",
    "hidden_act",
    None,
)

INI = FtIni(
    sections=(IniSection("gptneox", (*ROTARY_GPT_KEYS, "use_gptj_residual", "weight_data_type", HIDDEN_ACT)),),
    hf_fields={
        "hidden_size": "H",
        "num_attention_heads": "N",
        "intermediate_size": "I",
        "num_hidden_layers": "i",
        "rotary_pct": lambda q: q["rotary_embedding"] / q["D"],
        "vocab_size": "V",
        "bos_token_id": "start_id",
        "eos_token_id": "end_id",
        "use_parallel_residual": lambda q: bool(q["use_gptj_residual"]),
        "hidden_act": "hidden_act",
    },
    hf_constants={
        "model_type": "gpt_neox",
        "rotary_emb_base": FT_ROTARY_BASE,
        "layer_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    },
)
"""``[gptneox]``; an absent ``use_gptj_residual`` is FT's default, the parallel residual."""


class GPTNeoX(Family):
    """GPT-NeoX: fused head-interleaved QKV, NeoX-style partial rotary, parallel or sequential residual."""

    name = "gptneox"
    title = "GPT-NeoX (EleutherAI GPT-NeoX-20B, Pythia, h2oGPT)"
    hf_model_types = ("gpt_neox",)
    hf_architectures = ("GPTNeoXForCausalLM",)
    presets = {
        "gptneox": Preset(
            "hf://h2oai/h2ogpt-oig-oasst1-512-6_9b",
            description="h2oGPT 6.9B (Pythia-6.9B architecture), Hugging Face weights",
            license="apache-2.0",
            hf_config=_config(4096, 32, 16384, 32),
        ),
        "gpt-neox-20b": Preset(
            "hf://EleutherAI/gpt-neox-20b",
            description="GPT-NeoX 20B, Hugging Face weights",
            license="apache-2.0",
            hf_config={**_config(6144, 64, 24576, 44), "hidden_act": "gelu_fast", "torch_dtype": "float16"},
        ),
    }
    tensors = TENSORS
    ini = INI
    triton_model_type = "GPT-NeoX"
    weight_dtypes = ("fp32", "fp16", "bf16")
    data_types = ("fp32", "fp16")
    data_type_note = (
        "the FasterTransformer backend builds GPT-NeoX only in fp16; any other data_type "
        "(bf16 included, despite the README) silently runs as fp32"
    )
    hf_model_class = "GPTNeoXForCausalLM"

    def spec(self, hf_config: Mapping[str, Any]) -> ModelSpec:
        width, heads = int(hf_config["hidden_size"]), int(hf_config["num_attention_heads"])
        head_size = head_size_of(width, heads, "hidden_size", "num_attention_heads")
        _check_runnable(hf_config)
        parallel = bool(hf_config.get("use_parallel_residual", True))
        return ModelSpec(
            dims={
                "H": width,
                "N": heads,
                "D": head_size,
                "I": int(hf_config["intermediate_size"]),
                "V": int(hf_config["vocab_size"]),
            },
            layers={"i": int(hf_config["num_hidden_layers"])},
            start_id=int(hf_config.get("bos_token_id", 0)),
            end_id=int(hf_config.get("eos_token_id", 0)),
            pad_id=hf_config.get("pad_token_id"),
            extra={
                "rotary_embedding": checked_rotary(
                    int(head_size * _rotary_pct(hf_config)), head_size, "the rotary share (rotary_pct x head size)"
                ),
                "use_gptj_residual": int(parallel),
                "hidden_act": str(hf_config.get("hidden_act", "gelu")),
            },
        )

    def tensor_map(self, spec: ModelSpec) -> TensorMap:
        return TENSORS if spec.extra["use_gptj_residual"] else TENSORS_SEQUENTIAL


def _rope(hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """The rotary settings of either config.json spelling: transformers 4 keeps them at the top level
    (``rotary_pct``, ``rotary_emb_base``, ``rope_scaling``), transformers 5 in ``rope_parameters``
    (``partial_rotary_factor``, ``rope_theta``, ``rope_type``)."""
    nested = hf_config.get("rope_parameters")
    rope = dict(nested) if isinstance(nested, Mapping) else {}
    for key in ("rotary_pct", "partial_rotary_factor", "rotary_emb_base", "rope_theta"):
        if hf_config.get(key) is not None:
            rope[key] = hf_config[key]
    scaling = hf_config.get("rope_scaling")
    if isinstance(scaling, Mapping) and (scaling.get("rope_type") or scaling.get("type")):
        rope["rope_type"] = scaling.get("rope_type") or scaling.get("type")
    return rope


def _rotary_pct(hf_config: Mapping[str, Any]) -> float:
    rope = _rope(hf_config)
    for key in ("rotary_pct", "partial_rotary_factor"):
        if rope.get(key) is not None:
            return float(rope[key])
    return ROTARY_PCT_DEFAULT


def _check_runnable(hf_config: Mapping[str, Any]) -> None:
    """Refuse configurations FasterTransformer's GPT-NeoX would run as a different model."""
    rope = _rope(hf_config)
    base = rope.get("rotary_emb_base", rope.get("rope_theta", FT_ROTARY_BASE))
    if float(base) != FT_ROTARY_BASE:
        raise ConfigError(
            f"this GPT-NeoX uses rotary base {base}; FasterTransformer hard-codes {FT_ROTARY_BASE}",
            hint="FasterTransformer cannot serve this checkpoint correctly",
        )
    scaling = rope.get("rope_type")
    if scaling not in (None, "default"):
        raise ConfigError(
            f"this GPT-NeoX uses {scaling!r} rotary scaling; FasterTransformer has none",
            hint="FasterTransformer cannot serve this checkpoint correctly",
        )
    if hf_config.get("attention_bias", True) is False:
        raise ConfigError(
            "this GPT-NeoX has no attention biases; FasterTransformer's GPT-NeoX loads them",
            hint="FasterTransformer cannot serve this checkpoint",
        )
