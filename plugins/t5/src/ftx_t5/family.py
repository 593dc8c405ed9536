"""T5 (t5-3b and the other v1.0 checkpoints; T5 v1.1 / Flan-T5): tensor tables and FT hyper-parameters.

FasterTransformer reads T5 from ``[encoder]``, ``[decoder]`` and ``[structure]`` of config.ini and
from files without a ``model.`` prefix. Differences from upstream's converter, each
covered by a test:

* upstream's ``shared.weight.bin`` (the transposed embedding) is **not written**: no FT loader
  reads it (they read ``shared.weight_T.bin``), and it would cost ``V*H`` more bytes;
* config.ini holds the keys FasterTransformer and its T5 examples read, not a dump of the whole
  HF config (whose keys vary with the transformers version); booleans are ``true``/``false``;
* weights may be written as bf16 (upstream: fp32 or fp16 only);
* the old cross-attention bias some v1.0 checkpoints carry
  (``decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight``) is skipped — HF
  itself ignores it on load and FT has no file for it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog
from ftx_triton.plugin_api import (
    ConfigError,
    Family,
    FtIni,
    IniSection,
    M,
    ModelSpec,
    Preset,
    Skip,
    TensorMap,
    ops,
    read_config_json,
)

log = structlog.get_logger(__name__)

# Spec dims: H d_model, N heads, D d_kv, A = N*D (attention width, != H in general), I d_ff,
# V vocab, B relative-attention buckets. Placeholders: {e} encoder blocks, {d} decoder blocks.
ENC, DEC = "encoder.block.{e}", "decoder.block.{d}"
ENC_ATT, ENC_FFN = f"{ENC}.layer.0.SelfAttention", f"{ENC}.layer.1.DenseReluDense"
DEC_ATT, DEC_XATT = f"{DEC}.layer.0.SelfAttention", f"{DEC}.layer.1.EncDecAttention"
DEC_FFN = f"{DEC}.layer.2.DenseReluDense"
REL_BIAS = "block.0.layer.0.SelfAttention.relative_attention_bias.weight"  # block 0 only, shared by all blocks
COL, ROW = -1, 0
"""FT split axes: column-parallel weights ([in, out/tp]) and row-parallel ones ([in/tp, out])."""

# fmt: off
COMMON = (
    #  Hugging Face source                  FT file stem                          op / split / HF shape
    M("shared.weight",                      "shared.weight_T",                    shape=("V", "H")),
    # encoder
    M(f"{ENC_ATT}.q.weight",                f"{ENC_ATT}.q.weight",                ops.transpose, COL, ("A", "H")),
    M(f"{ENC_ATT}.k.weight",                f"{ENC_ATT}.k.weight",                ops.transpose, COL, ("A", "H")),
    M(f"{ENC_ATT}.v.weight",                f"{ENC_ATT}.v.weight",                ops.transpose, COL, ("A", "H")),
    M(f"{ENC_ATT}.o.weight",                f"{ENC_ATT}.o.weight",                ops.transpose, ROW, ("H", "A")),
    M(f"encoder.{REL_BIAS}",                f"encoder.{REL_BIAS}",                ops.transpose, 0, ("B", "N")),
    M(f"{ENC}.layer.0.layer_norm.weight",   f"{ENC}.layer.0.layer_norm.weight",   shape=("H",)),
    M(f"{ENC_FFN}.wo.weight",               f"{ENC_FFN}.wo.weight",               ops.transpose, ROW, ("H", "I")),
    M(f"{ENC}.layer.1.layer_norm.weight",   f"{ENC}.layer.1.layer_norm.weight",   shape=("H",)),
    M("encoder.final_layer_norm.weight",    "encoder.final_layer_norm.weight",    shape=("H",)),
    # decoder: self-attention q, k, v fused into one [H, 3, A] file
    M((f"{DEC_ATT}.q.weight", f"{DEC_ATT}.k.weight", f"{DEC_ATT}.v.weight"),
                                            f"{DEC_ATT}.qkv.weight",              ops.fuse_qkv, COL, ("A", "H")),
    M(f"{DEC_ATT}.o.weight",                f"{DEC_ATT}.o.weight",                ops.transpose, ROW, ("H", "A")),
    M(f"decoder.{REL_BIAS}",                f"decoder.{REL_BIAS}",                ops.transpose, 0, ("B", "N")),
    M(f"{DEC}.layer.0.layer_norm.weight",   f"{DEC}.layer.0.layer_norm.weight",   shape=("H",)),
    M(f"{DEC_XATT}.q.weight",               f"{DEC_XATT}.q.weight",               ops.transpose, COL, ("A", "H")),
    M(f"{DEC_XATT}.k.weight",               f"{DEC_XATT}.k.weight",               ops.transpose, COL, ("A", "H")),
    M(f"{DEC_XATT}.v.weight",               f"{DEC_XATT}.v.weight",               ops.transpose, COL, ("A", "H")),
    M(f"{DEC_XATT}.o.weight",               f"{DEC_XATT}.o.weight",               ops.transpose, ROW, ("H", "A")),
    M(f"{DEC}.layer.1.layer_norm.weight",   f"{DEC}.layer.1.layer_norm.weight",   shape=("H",)),
    M(f"{DEC_FFN}.wo.weight",               f"{DEC_FFN}.wo.weight",               ops.transpose, ROW, ("H", "I")),
    M(f"{DEC}.layer.2.layer_norm.weight",   f"{DEC}.layer.2.layer_norm.weight",   shape=("H",)),
    M("decoder.final_layer_norm.weight",    "decoder.final_layer_norm.weight",    shape=("H",)),
    # Tied copies of shared.weight (present in older checkpoints); FT reads shared.weight_T instead.
    # Some v1.0 checkpoints also carry a cross-attention bias that no model uses (HF ignores it on load).
    Skip("encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
         "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"),
)
# fmt: on

# FFN input: one matrix `wi` (v1.0: relu) or a gated pair (v1.1/Flan: `wi_0` is activated -> FT `wi`,
# `wi_1` is the linear branch -> FT `wi2`).
# fmt: off
PLAIN_FFN = (
    M(f"{ENC_FFN}.wi.weight",               f"{ENC_FFN}.wi.weight",               ops.transpose, COL, ("I", "H")),
    M(f"{DEC_FFN}.wi.weight",               f"{DEC_FFN}.wi.weight",               ops.transpose, COL, ("I", "H")),
)
# fmt: on
# fmt: off
GATED_FFN = (
    M(f"{ENC_FFN}.wi_0.weight",             f"{ENC_FFN}.wi.weight",               ops.transpose, COL, ("I", "H")),
    M(f"{ENC_FFN}.wi_1.weight",             f"{ENC_FFN}.wi2.weight",              ops.transpose, COL, ("I", "H")),
    M(f"{DEC_FFN}.wi_0.weight",             f"{DEC_FFN}.wi.weight",               ops.transpose, COL, ("I", "H")),
    M(f"{DEC_FFN}.wi_1.weight",             f"{DEC_FFN}.wi2.weight",              ops.transpose, COL, ("I", "H")),
)
# fmt: on

# LM head: always written (FT would otherwise fall back to shared.weight_T). A tied checkpoint is
# usually saved without lm_head.weight, so it comes from shared.weight; an untied one must have it.
TIED_HEAD = (M("lm_head.weight|shared.weight", "lm_head.weight", shape=("V", "H")),)
SEPARATE_HEAD = (M("lm_head.weight", "lm_head.weight", shape=("V", "H")),)


def t5_table(*, gated: bool, tied: bool) -> TensorMap:
    """The table of one T5 variant: FFN kind x LM-head kind."""
    return TensorMap(*COMMON, *(GATED_FFN if gated else PLAIN_FFN), *(TIED_HEAD if tied else SEPARATE_HEAD))


def variant(*, gated: bool, tied: bool) -> str:
    return f"{'gated' if gated else 'plain'}-{'tied' if tied else 'separate'}"


TABLES: dict[str, TensorMap] = {
    variant(gated=g, tied=t): t5_table(gated=g, tied=t) for g in (False, True) for t in (True, False)
}
"""Every table variant, built once: ``plain-tied`` (t5-3b), ``gated-separate`` (Flan-T5) …"""

ACTIVATIONS = ("relu", "gelu", "silu", "gated-gelu", "gated-relu", "gated-silu")
"""``feed_forward_proj`` values FasterTransformer's T5 accepts (anything else aborts the server)."""

T5_DEFAULTS: dict[str, Any] = {
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "feed_forward_proj": "relu",
    "layer_norm_epsilon": 1e-6,
    "tie_word_embeddings": True,
    "pad_token_id": 0,
    "eos_token_id": 1,
}
"""transformers' T5Config defaults: config.json leaves out values equal to them."""

FT_MAX_DISTANCE = 128
"""FasterTransformer hard-codes relative_attention_max_distance."""

GEMM_DTYPE_CODES = {"fp32": 0, "fp16": 1, "bf16": 2}

T5_3B_CONFIG: dict[str, Any] = {
    "model_type": "t5",
    "architectures": ["T5WithLMHeadModel"],
    "d_model": 1024,
    "d_kv": 128,
    "num_heads": 32,
    "d_ff": 16384,
    "num_layers": 24,
    "vocab_size": 32128,
    "relative_attention_num_buckets": 32,
    "feed_forward_proj": "relu",
    "layer_norm_epsilon": 1e-6,
    "decoder_start_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 0,
    "is_encoder_decoder": True,
}
FLAN_T5_XL_CONFIG: dict[str, Any] = {
    "model_type": "t5",
    "architectures": ["T5ForConditionalGeneration"],
    "d_model": 2048,
    "d_kv": 64,
    "num_heads": 32,
    "d_ff": 5120,
    "num_layers": 24,
    "num_decoder_layers": 24,
    "vocab_size": 32128,
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "feed_forward_proj": "gated-gelu",
    "dense_act_fn": "gelu_new",
    "is_gated_act": True,
    "layer_norm_epsilon": 1e-6,
    "tie_word_embeddings": False,
    "decoder_start_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 0,
    "is_encoder_decoder": True,
}


def _int(hf_config: Mapping[str, Any], key: str) -> int:
    value = hf_config.get(key)
    if value is None:
        raise ConfigError(
            f"config.json has no {key!r}, which a T5 checkpoint needs",
            hint="point at a T5ForConditionalGeneration checkpoint (config.json + weights)",
        )
    return int(value)


STACK_KEYS = (
    "_name_or_path",
    "model_type",
    "num_heads",
    "d_kv",
    "d_model",
    "d_ff",
    "num_layers",
    "num_decoder_layers",
    "vocab_size",
    "relative_attention_num_buckets_or_max_pos_seq_len",
    "relative_attention_max_distance",
    "feed_forward_proj",
    "is_gated_act",
    "layer_norm_epsilon",
    "tie_word_embeddings",
    "decoder_start_token_id",
    "eos_token_id",
    "pad_token_id",
    "weight_data_type",
)
"""The keys FasterTransformer's Triton T5 and its PyTorch T5 examples read, not a dump of the HF config."""


def _activation(q: Mapping[str, Any]) -> str:
    """``feed_forward_proj``, gated when ``[structure]`` says so (``use_gated_activation = 1`` next to ``gelu``)."""
    activation = str(q["feed_forward_proj"])
    return f"gated-{activation}" if q.get("gated") and not activation.startswith("gated-") else activation


INI = FtIni(
    sections=(
        IniSection("encoder", STACK_KEYS, layers="e", values={"model_type": "t5"}),
        IniSection("decoder", STACK_KEYS, layers="d", values={"model_type": "t5"}),
        IniSection(
            "structure",
            ("t5_with_bias", "use_gated_activation", "position_embedding_type"),
            required=False,
            values={"t5_with_bias": False, "position_embedding_type": "relative"},
        ),
    ),
    hf_fields={
        "_name_or_path": "name",
        "d_model": "H",
        "d_kv": "D",
        "num_heads": "N",
        "d_ff": "I",
        "num_layers": "e",
        "num_decoder_layers": "d",
        "vocab_size": "V",
        "relative_attention_num_buckets": "B",
        "relative_attention_max_distance": "relative_attention_max_distance",
        "feed_forward_proj": _activation,
        "layer_norm_epsilon": "layer_norm_epsilon",
        "tie_word_embeddings": "tie_word_embeddings",
        "decoder_start_token_id": "start_id",
        "eos_token_id": "end_id",
        "pad_token_id": "pad_id",
    },
    hf_constants={"model_type": "t5", "is_encoder_decoder": True},
)
"""``[encoder]``, ``[decoder]`` (the same keys; ``num_layers`` counts each stack) and ``[structure]``."""


class T5(Family):
    """T5 encoder-decoder: relative position bias, RMS layernorm, no biases, relu or gated FFN."""

    name = "t5"
    title = "T5 (t5-3b; T5 v1.1 / Flan-T5)"
    hf_model_types = ("t5",)
    hf_architectures = ("T5ForConditionalGeneration", "T5WithLMHeadModel")
    presets = {
        "t5": Preset(
            "hf://google-t5/t5-3b",
            description="T5 3B (v1.0, relu, tied embeddings)",
            license="apache-2.0",
            hf_config=T5_3B_CONFIG,
        ),
        "flan-t5-xl": Preset(
            "hf://google/flan-t5-xl",
            description="Flan-T5 XL 3B (gated-gelu); use bf16 or fp32",
            license="apache-2.0",
            hf_config=FLAN_T5_XL_CONFIG,
        ),
    }
    tensors = TABLES["plain-tied"]
    """The v1.0 table (t5-3b); :meth:`tensor_map` picks the variant of each checkpoint."""
    ini = INI
    triton_model_type = "T5"
    triton_io = "encoder-decoder"
    data_types = ("fp32", "fp16", "bf16")
    weight_dtypes = ("fp32", "fp16", "bf16")
    gemm_tool = "t5_gemm"
    tokenizer_kind = "sentencepiece"
    special_tokens = {"eos": "</s>", "pad": "<pad>"}
    hf_model_class = "T5ForConditionalGeneration"

    # -- table -------------------------------------------------------------------------------

    def tensor_map(self, spec: ModelSpec) -> TensorMap:
        return TABLES[variant(gated=bool(spec.extra["gated"]), tied=bool(spec.extra["tie_word_embeddings"]))]

    def fingerprint(self) -> str:
        digests = "".join(f"{name}:{table.digest()}" for name, table in TABLES.items())
        return hashlib.sha256((super().fingerprint() + digests).encode()).hexdigest()

    # -- hyper-parameters --------------------------------------------------------------------

    def read_hf_config(self, path: Path) -> dict[str, Any]:
        """config.json, named like ``from_pretrained(path)`` names it (FT requires ``_name_or_path``)."""
        config = read_config_json(path)
        config.setdefault("_name_or_path", path.name)
        return config

    def spec(self, hf_config: Mapping[str, Any]) -> ModelSpec:
        c = {**T5_DEFAULTS, **{k: v for k, v in hf_config.items() if v is not None}}
        heads, head_size = _int(c, "num_heads"), _int(c, "d_kv")
        encoder_layers = _int(c, "num_layers")
        decoder_layers = int(c.get("num_decoder_layers") or encoder_layers)
        activation = str(c["feed_forward_proj"])
        if activation not in ACTIVATIONS:
            raise ConfigError(
                f"feed_forward_proj {activation!r} is not an activation FasterTransformer's T5 runs",
                hint=f"FasterTransformer supports {', '.join(ACTIVATIONS)}",
            )
        max_distance = int(c["relative_attention_max_distance"])
        if max_distance != FT_MAX_DISTANCE:
            log.warning(
                "config.value_ignored",
                key="relative_attention_max_distance",
                value=max_distance,
                used=FT_MAX_DISTANCE,
                reason="FasterTransformer hard-codes it",
            )
        pad_id = int(c["pad_token_id"])
        start_id = int(c.get("decoder_start_token_id", pad_id))
        return ModelSpec(
            dims={
                "H": _int(c, "d_model"),
                "N": heads,
                "D": head_size,
                "A": heads * head_size,
                "I": _int(c, "d_ff"),
                "V": _int(c, "vocab_size"),
                "B": int(c["relative_attention_num_buckets"]),
            },
            layers={"e": encoder_layers, "d": decoder_layers},
            start_id=start_id,
            end_id=int(c["eos_token_id"]),
            pad_id=pad_id,
            tp_divisible=("N", "I"),
            extra={
                "name": str(c.get("_name_or_path") or self.name),
                "feed_forward_proj": activation,
                "gated": activation.startswith("gated-"),
                "tie_word_embeddings": bool(c["tie_word_embeddings"]),
                "relative_attention_max_distance": max_distance,
                "layer_norm_epsilon": float(c["layer_norm_epsilon"]),
            },
        )

    def gemm_args(
        self, spec: ModelSpec, *, batch: int, beam: int, max_input_len: int, data_type: str, tp: int
    ) -> list[str]:
        """``t5_gemm batch beam max_mem_seq_len`` + encoder and decoder ``d_model heads d_kv d_ff``
        + ``vocab dtype tp`` (HF T5 uses one width for both stacks)."""
        d = spec.dims
        stack = (d["H"], d["N"], d["D"], d["I"])
        return [str(v) for v in (batch, beam, max_input_len, *stack, *stack, d["V"], GEMM_DTYPE_CODES[data_type], tp)]
