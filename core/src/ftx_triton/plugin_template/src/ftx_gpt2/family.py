"""GPT-2: a tensor table, the FT hyper-parameters, its config.ini as data, and one custom op.

GPT-2 stores its projections as Conv1D weights ``[in, out]`` (already FT's orientation), with q, k
and v fused along the output axis (``c_attn``: ``[H, 3H]``). FT wants ``[H, 3, H]`` split by heads
on the last axis, which is a reshape — defined here as an :class:`ftx_triton.conversion.ops.Op` with its inverse.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ftx_triton.plugin_api import Family, FtIni, IniSection, M, ModelSpec, Op, Preset, Skip, TensorMap

split_fused_qkv = Op(
    "gpt2_split_fused_qkv",
    forward=lambda xs, ctx: xs[0].reshape(*xs[0].shape[:-1], 3, xs[0].shape[-1] // 3),
    shape=lambda shapes, ctx: (*shapes[0][:-1], 3, shapes[0][-1] // 3),
    inverse=lambda y, ctx: [y.reshape(*y.shape[:-2], y.shape[-2] * y.shape[-1])],
)
"""``[..., 3H]`` (q | k | v) -> ``[..., 3, H]``; works for the weight and the bias."""

L = "transformer.h.{i}"
FT = "model.layers.{i}"

# fmt: off
TENSORS = TensorMap(
    M("transformer.wte.weight",          "model.wte",                                shape=("V", "H")),
    M("transformer.wpe.weight",          "model.wpe",                                shape=("P", "H")),
    M(f"{L}.ln_1.weight",                f"{FT}.input_layernorm.weight",             shape=("H",)),
    M(f"{L}.ln_1.bias",                  f"{FT}.input_layernorm.bias",               shape=("H",)),
    M(f"{L}.attn.c_attn.weight",         f"{FT}.attention.query_key_value.weight",   split_fused_qkv, -1, ("H", "3*H")),
    M(f"{L}.attn.c_attn.bias",           f"{FT}.attention.query_key_value.bias",     split_fused_qkv, -1, ("3*H",)),
    M(f"{L}.attn.c_proj.weight",         f"{FT}.attention.dense.weight",             split=0, shape=("H", "H")),
    M(f"{L}.attn.c_proj.bias",           f"{FT}.attention.dense.bias",               shape=("H",)),
    M(f"{L}.ln_2.weight",                f"{FT}.post_attention_layernorm.weight",    shape=("H",)),
    M(f"{L}.ln_2.bias",                  f"{FT}.post_attention_layernorm.bias",      shape=("H",)),
    M(f"{L}.mlp.c_fc.weight",            f"{FT}.mlp.dense_h_to_4h.weight",           split=-1, shape=("H", "I")),
    M(f"{L}.mlp.c_fc.bias",              f"{FT}.mlp.dense_h_to_4h.bias",             split=-1, shape=("I",)),
    M(f"{L}.mlp.c_proj.weight",          f"{FT}.mlp.dense_4h_to_h.weight",           split=0, shape=("I", "H")),
    M(f"{L}.mlp.c_proj.bias",            f"{FT}.mlp.dense_4h_to_h.bias",             shape=("H",)),
    M("transformer.ln_f.weight",         "model.final_layernorm.weight",             shape=("H",)),
    M("transformer.ln_f.bias",           "model.final_layernorm.bias",               shape=("H",)),
    Skip(f"{L}.attn.bias", f"{L}.attn.masked_bias", "lm_head.weight"),  # buffers; lm_head is tied to wte
)
# fmt: on


class GPT2(Family):
    """GPT-2 (OpenAI GPT-2 and fine-tunes) for FasterTransformer's GPT model."""

    name = "gpt2"
    title = "GPT-2 (template example)"
    hf_model_types = ("gpt2",)
    hf_architectures = ("GPT2LMHeadModel",)
    presets = {"gpt2": Preset("hf://openai-community/gpt2", description="GPT-2 124M", license="mit")}
    tensors = TENSORS
    ini = FtIni(
        # The section FT's GPT model reads; keys from ftx_triton.conversion.ftini.KEYS, in the order they are written.
        sections=(
            IniSection(
                "gpt",
                (
                    "model_name",
                    "head_num",
                    "size_per_head",
                    "inter_size",
                    "num_layer",
                    "max_pos_seq_len",
                    "vocab_size",
                    "start_id",
                    "end_id",
                    "layernorm_eps",
                    "weight_data_type",
                ),
            ),
        ),
        # Read back for the python runtime: Hugging Face field <- spec quantity (dims, layers "i", ids, extra).
        hf_fields={
            "n_embd": "H",
            "n_head": "N",
            "n_inner": "I",
            "n_layer": "i",
            "n_positions": "P",
            "vocab_size": "V",
            "bos_token_id": "start_id",
            "eos_token_id": "end_id",
            "layer_norm_epsilon": "layernorm_eps",
        },
        hf_constants={"model_type": "gpt2"},
    )
    triton_model_type = "GPT"
    hf_model_class = "GPT2LMHeadModel"

    def spec(self, hf_config: Mapping[str, Any]) -> ModelSpec:
        width, heads = int(hf_config["n_embd"]), int(hf_config["n_head"])
        return ModelSpec(
            dims={
                "H": width,
                "N": heads,
                "D": width // heads,
                "I": int(hf_config.get("n_inner") or 4 * width),
                "V": int(hf_config["vocab_size"]),
                "P": int(hf_config["n_positions"]),
            },
            layers={"i": int(hf_config["n_layer"])},
            start_id=int(hf_config.get("bos_token_id", 50256)),
            end_id=int(hf_config.get("eos_token_id", 50256)),
            extra={"layernorm_eps": float(hf_config.get("layer_norm_epsilon", 1e-5))},
        )
