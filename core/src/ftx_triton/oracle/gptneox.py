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
from ftx_triton.oracle.decoder import DecoderDims, LayerWeights
from ftx_triton.oracle.files import FtFiles, rotary_of

LAYERNORM_EPS = 1e-5


def logits(files: FtFiles, input_ids: Sequence[int]) -> np.ndarray:
    """``[tokens, vocab]`` logits of ``input_ids`` (context phase, positions from 0)."""
    ini = files.section("gptneox")
    d = DecoderDims.of(files, ini)
    rotary_dim = rotary_of(ini, d.head_size)
    parallel = bool(ini.integer("use_gptj_residual", 1))
    tp = files.tp

    x = d.whole("model.wte", d.vocab, d.hidden)[np.asarray(input_ids)]
    for layer in range(ini.integer("num_layer")):
        stem = f"model.layers.{layer}"
        w = d.layer(stem, qkv_bias=True)

        def attention(h: np.ndarray, r: int, w: LayerWeights = w) -> np.ndarray:
            return w.attention(h, r, head_size=d.head_size, rotary_dim=rotary_dim, neox_style=True)

        h = d.layer_norm(f"{stem}.input_layernorm", x, LAYERNORM_EPS)
        if parallel:
            h2 = d.layer_norm(f"{stem}.post_attention_layernorm", x, LAYERNORM_EPS)
            bias_sum = d.whole(f"{stem}.mlp.attention.bias.sum", d.hidden)
            x = nn.all_reduce(attention(h, r) + w.mlp(h2, r) + bias_sum + x / tp for r in range(tp))
        else:
            a = (
                x
                + nn.all_reduce(attention(h, r) for r in range(tp))
                + d.whole(f"{stem}.attention.dense.bias", d.hidden)
            )
            h2 = d.layer_norm(f"{stem}.post_attention_layernorm", a, LAYERNORM_EPS)
            x = a + nn.all_reduce(w.mlp(h2, r) for r in range(tp)) + d.whole(f"{stem}.mlp.dense_4h_to_h.bias", d.hidden)
    x = d.layer_norm("model.final_layernorm", x, LAYERNORM_EPS)
    return x @ d.whole("model.lm_head.weight", d.vocab, d.hidden).T
