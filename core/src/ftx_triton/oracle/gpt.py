"""FasterTransformer's GPT (``models/multi_gpu_gpt``: GPT-2, Megatron GPT, OPT, BLOOM-less) on CPU.

config.ini ``[gpt]`` chooses the variant as FT's Triton model does: ``layernorm_eps`` (default
1e-6), ``layernorm_type`` (``pre_layernorm`` or ``post_layernorm``), ``activation_type`` (``Gelu``,
``Relu``, ``Silu``), ``has_positional_encoding`` (``model.wpe``, ``max_pos_seq_len`` rows),
``has_pre_decoder_layernorm``, ``has_post_decoder_layernorm``. The LM head is
``model.lm_head.weight`` when that file exists, else the embedding. Gated activations, ALiBi
(``use_attention_linear_bias``) and adapters are not modelled: such a directory is refused.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ftx_triton.errors import ConfigError
from ftx_triton.oracle import nn
from ftx_triton.oracle.decoder import DecoderDims
from ftx_triton.oracle.files import FtFiles


def logits(files: FtFiles, input_ids: Sequence[int]) -> np.ndarray:
    """``[tokens, vocab]`` logits of ``input_ids`` (context phase, positions from 0)."""
    ini = files.section("gpt")
    d = DecoderDims.of(files, ini)
    eps = ini.number("layernorm_eps", 1e-6)
    post_norm = _layernorm_type(ini.text("layernorm_type", "pre_layernorm"))
    act_name = ini.text("activation_type", "Gelu").lower()
    if act_name not in nn.ACTIVATIONS:
        raise ConfigError(
            f"the reference models FasterTransformer's GPT with Gelu, Relu or Silu, not {act_name!r}",
            hint="ftx verify cannot check this model",
        )
    for flag in ("use_attention_linear_bias", "has_adapters"):
        if ini.flag(flag, False):
            raise ConfigError(
                f"the reference does not model FasterTransformer's GPT with {flag}",
                hint="ftx verify cannot check this model",
            )
    act = nn.ACTIVATIONS[act_name]

    ids = np.asarray(input_ids)
    wte = d.whole("model.wte", d.vocab, d.hidden)
    x = wte[ids]
    if ini.flag("has_positional_encoding", True):
        positions = ini.size("max_pos_seq_len")
        if positions < len(ids):
            raise ConfigError(
                f"[gpt] max_pos_seq_len = {positions} is shorter than the {len(ids)}-token prompt the reference runs",
                hint="ftx verify cannot check a model this short",
            )
        x = x + d.whole("model.wpe", positions, d.hidden)[np.arange(len(ids))]
    if ini.flag("has_pre_decoder_layernorm", False):
        x = d.layer_norm("model.pre_decoder_layernorm", x, eps)
    for layer in range(ini.integer("num_layer")):
        stem = f"model.layers.{layer}"
        w = d.layer(stem, qkv_bias=True)
        dense_bias = d.whole(f"{stem}.attention.dense.bias", d.hidden)
        down_bias = d.whole(f"{stem}.mlp.dense_4h_to_h.bias", d.hidden)
        h = x if post_norm else d.layer_norm(f"{stem}.input_layernorm", x, eps)
        a = x + nn.all_reduce(w.attention(h, r, head_size=d.head_size) for r in range(files.tp)) + dense_bias
        if post_norm:
            a = d.layer_norm(f"{stem}.input_layernorm", a, eps)
        h2 = a if post_norm else d.layer_norm(f"{stem}.post_attention_layernorm", a, eps)
        x = a + nn.all_reduce(w.mlp(h2, r, act) for r in range(files.tp)) + down_bias
        if post_norm:
            x = d.layer_norm(f"{stem}.post_attention_layernorm", x, eps)
    if ini.flag("has_post_decoder_layernorm", True):
        x = d.layer_norm("model.final_layernorm", x, eps)
    head = d.whole("model.lm_head.weight", d.vocab, d.hidden) if files.exists("model.lm_head.weight") else wte
    return x @ head.T


def _layernorm_type(text: str) -> bool:
    """True for ``post_layernorm``, False for ``pre_layernorm`` (FT aborts on anything else)."""
    if text not in ("pre_layernorm", "post_layernorm"):
        raise ConfigError(
            f"[gpt] layernorm_type = {text!r}; FasterTransformer knows pre_layernorm and post_layernorm",
            hint="re-convert the checkpoint with ftx convert",
        )
    return text == "post_layernorm"
