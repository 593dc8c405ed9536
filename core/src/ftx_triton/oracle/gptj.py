"""FasterTransformer's GPT-J (``models/gptj``; KoGPT too) on CPU, from its converted files.

Per layer: one layernorm (eps 1e-6, FT's constant) feeds both the attention (fused qkv without
bias, GPT-J-style interleaved rotary over ``rotary_embedding`` dims) and the GELU MLP; the block
output is ``input + attention + mlp + mlp.dense_4h_to_h.bias``. The LM head has a bias.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ftx_triton.oracle import nn
from ftx_triton.oracle.files import FtFiles, rotary_of, split

LAYERNORM_EPS = 1e-6


def logits(files: FtFiles, input_ids: Sequence[int]) -> np.ndarray:
    """``[tokens, vocab]`` logits of ``input_ids`` (context phase, positions from 0)."""
    ini = files.section("gptj")
    dtype, tp = ini.file_dtype(), files.tp
    heads, size = ini.size("head_num"), ini.size("size_per_head")
    hidden, inter, vocab = heads * size, ini.size("inter_size"), ini.size("vocab_size")
    rotary_dim = rotary_of(ini, size)
    local, local_inter = split(hidden, tp, "head_num * size_per_head"), split(inter, tp, "inter_size")

    x = files.whole("model.wte", (vocab, hidden), dtype)[np.asarray(input_ids)]
    for layer in range(ini.integer("num_layer")):
        stem = f"model.layers.{layer}"
        h = nn.layer_norm(
            x,
            files.whole(f"{stem}.input_layernorm.weight", (hidden,), dtype),
            files.whole(f"{stem}.input_layernorm.bias", (hidden,), dtype),
            LAYERNORM_EPS,
        )
        qkv = files.ranks(f"{stem}.attention.query_key_value.weight", (hidden, 3 * local), dtype)
        dense = files.ranks(f"{stem}.attention.dense.weight", (local, hidden), dtype)
        up = files.ranks(f"{stem}.mlp.dense_h_to_4h.weight", (hidden, local_inter), dtype)
        up_bias = files.ranks(f"{stem}.mlp.dense_h_to_4h.bias", (local_inter,), dtype)
        down = files.ranks(f"{stem}.mlp.dense_4h_to_h.weight", (local_inter, hidden), dtype)
        attention = nn.all_reduce(
            nn.gpt_attention(h, qkv[r], None, dense[r], head_size=size, rotary_dim=rotary_dim, neox_style=False)
            for r in range(tp)
        )
        mlp = nn.all_reduce(nn.gelu(h @ up[r] + up_bias[r]) @ down[r] for r in range(tp))
        x = x + attention + mlp + files.whole(f"{stem}.mlp.dense_4h_to_h.bias", (hidden,), dtype)
    x = nn.layer_norm(
        x,
        files.whole("model.final_layernorm.weight", (hidden,), dtype),
        files.whole("model.final_layernorm.bias", (hidden,), dtype),
        LAYERNORM_EPS,
    )
    head = files.whole("model.lm_head.weight", (vocab, hidden), dtype)
    return x @ head.T + files.whole("model.lm_head.bias", (vocab,), dtype)
