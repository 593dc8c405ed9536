"""FasterTransformer's GPT-J (``models/gptj``; KoGPT too) on CPU, from its converted files.

Per layer: one layernorm (eps 1e-6, FT's constant) feeds both the attention (fused qkv without
bias, GPT-J-style interleaved rotary over ``rotary_embedding`` dims) and the GELU MLP; the block
output is ``input + attention + mlp + mlp.dense_4h_to_h.bias``. The LM head has a bias.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ftx_triton.oracle import nn
from ftx_triton.oracle.decoder import DecoderDims
from ftx_triton.oracle.files import FtFiles, rotary_of

LAYERNORM_EPS = 1e-6


def logits(files: FtFiles, input_ids: Sequence[int]) -> np.ndarray:
    """``[tokens, vocab]`` logits of ``input_ids`` (context phase, positions from 0)."""
    ini = files.section("gptj")
    d = DecoderDims.of(files, ini)
    rotary_dim = rotary_of(ini, d.head_size)

    x = d.whole("model.wte", d.vocab, d.hidden)[np.asarray(input_ids)]
    for layer in range(ini.integer("num_layer")):
        stem = f"model.layers.{layer}"
        h = d.layer_norm(f"{stem}.input_layernorm", x, LAYERNORM_EPS)
        w = d.layer(stem, qkv_bias=False)
        attention = nn.all_reduce(
            w.attention(h, r, head_size=d.head_size, rotary_dim=rotary_dim, neox_style=False) for r in range(files.tp)
        )
        mlp = nn.all_reduce(w.mlp(h, r) for r in range(files.tp))
        x = x + attention + mlp + d.whole(f"{stem}.mlp.dense_4h_to_h.bias", d.hidden)
    x = d.layer_norm("model.final_layernorm", x, LAYERNORM_EPS)
    return x @ d.whole("model.lm_head.weight", d.vocab, d.hidden).T + d.whole("model.lm_head.bias", d.vocab)
