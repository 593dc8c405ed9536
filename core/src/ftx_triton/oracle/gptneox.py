"""FasterTransformer's GPT-NeoX (``models/gptneox``) on CPU, from its converted files.

Fused qkv with bias, NeoX-style (half-rotation) rotary over ``rotary_embedding`` dims, layernorm
eps 1e-5 (FT's constant), GELU MLP, an LM head without bias. Residual by ``use_gptj_residual``
(FT's default 1):

* parallel: ``mlp(post_ln(input))`` beside ``attention(input_ln(input))``; every rank adds
  ``mlp.attention.bias.sum`` (one file, read by all ranks) and ``input / tp`` before the single
  all-reduce; neither separate output bias is read;
* sequential: ``a = input + attention + attention.dense.bias``, then
  ``a + mlp(post_ln(a)) + mlp.dense_4h_to_h.bias`` (the biases once, after the all-reduce).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ftx_triton.oracle import nn
from ftx_triton.oracle.files import FtFiles, rotary_of, split

LAYERNORM_EPS = 1e-5


def logits(files: FtFiles, input_ids: Sequence[int]) -> np.ndarray:
    """``[tokens, vocab]`` logits of ``input_ids`` (context phase, positions from 0)."""
    ini = files.section("gptneox")
    dtype, tp = ini.file_dtype(), files.tp
    heads, size = ini.size("head_num"), ini.size("size_per_head")
    hidden, inter, vocab = heads * size, ini.size("inter_size"), ini.size("vocab_size")
    rotary_dim = rotary_of(ini, size)
    parallel = bool(ini.integer("use_gptj_residual", 1))
    local, local_inter = split(hidden, tp, "head_num * size_per_head"), split(inter, tp, "inter_size")

    def norm(stem: str, x: np.ndarray) -> np.ndarray:
        return nn.layer_norm(
            x,
            files.whole(f"{stem}.weight", (hidden,), dtype),
            files.whole(f"{stem}.bias", (hidden,), dtype),
            LAYERNORM_EPS,
        )

    x = files.whole("model.wte", (vocab, hidden), dtype)[np.asarray(input_ids)]
    for layer in range(ini.integer("num_layer")):
        stem = f"model.layers.{layer}"
        qkv = files.ranks(f"{stem}.attention.query_key_value.weight", (hidden, 3 * local), dtype)
        qkv_bias = files.ranks(f"{stem}.attention.query_key_value.bias", (3 * local,), dtype)
        dense = files.ranks(f"{stem}.attention.dense.weight", (local, hidden), dtype)
        up = files.ranks(f"{stem}.mlp.dense_h_to_4h.weight", (hidden, local_inter), dtype)
        up_bias = files.ranks(f"{stem}.mlp.dense_h_to_4h.bias", (local_inter,), dtype)
        down = files.ranks(f"{stem}.mlp.dense_4h_to_h.weight", (local_inter, hidden), dtype)

        def attention(
            h: np.ndarray, r: int, qkv: list = qkv, qkv_bias: list = qkv_bias, dense: list = dense
        ) -> np.ndarray:
            return nn.gpt_attention(
                h, qkv[r], qkv_bias[r], dense[r], head_size=size, rotary_dim=rotary_dim, neox_style=True
            )

        def mlp(h: np.ndarray, r: int) -> np.ndarray:
            return nn.gelu(h @ up[r] + up_bias[r]) @ down[r]  # noqa: B023

        h = norm(f"{stem}.input_layernorm", x)
        if parallel:
            h2 = norm(f"{stem}.post_attention_layernorm", x)
            bias_sum = files.whole(f"{stem}.mlp.attention.bias.sum", (hidden,), dtype)
            x = nn.all_reduce(attention(h, r) + mlp(h2, r) + bias_sum + x / tp for r in range(tp))
        else:
            a = (
                x
                + nn.all_reduce(attention(h, r) for r in range(tp))
                + files.whole(f"{stem}.attention.dense.bias", (hidden,), dtype)
            )
            h2 = norm(f"{stem}.post_attention_layernorm", a)
            x = (
                a
                + nn.all_reduce(mlp(h2, r) for r in range(tp))
                + files.whole(f"{stem}.mlp.dense_4h_to_h.bias", (hidden,), dtype)
            )
    x = norm("model.final_layernorm", x)
    return x @ files.whole("model.lm_head.weight", (vocab, hidden), dtype).T
