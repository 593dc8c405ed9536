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
from ftx_triton.oracle.files import FtFiles, split


def logits(files: FtFiles, input_ids: Sequence[int]) -> np.ndarray:
    """``[tokens, vocab]`` logits of ``input_ids`` (context phase, positions from 0)."""
    ini = files.section("gpt")
    dtype, tp = ini.file_dtype(), files.tp
    heads, size = ini.size("head_num"), ini.size("size_per_head")
    hidden, inter, vocab = heads * size, ini.size("inter_size"), ini.size("vocab_size")
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
    local, local_inter = split(hidden, tp, "head_num * size_per_head"), split(inter, tp, "inter_size")

    def norm(stem: str, x: np.ndarray) -> np.ndarray:
        return nn.layer_norm(
            x, files.whole(f"{stem}.weight", (hidden,), dtype), files.whole(f"{stem}.bias", (hidden,), dtype), eps
        )

    ids = np.asarray(input_ids)
    wte = files.whole("model.wte", (vocab, hidden), dtype)
    x = wte[ids]
    if ini.flag("has_positional_encoding", True):
        positions = ini.size("max_pos_seq_len")
        if positions < len(ids):
            raise ConfigError(
                f"[gpt] max_pos_seq_len = {positions} is shorter than the {len(ids)}-token prompt the reference runs",
                hint="ftx verify cannot check a model this short",
            )
        x = x + files.whole("model.wpe", (positions, hidden), dtype)[np.arange(len(ids))]
    if ini.flag("has_pre_decoder_layernorm", False):
        x = norm("model.pre_decoder_layernorm", x)
    for layer in range(ini.integer("num_layer")):
        stem = f"model.layers.{layer}"
        qkv = files.ranks(f"{stem}.attention.query_key_value.weight", (hidden, 3 * local), dtype)
        qkv_bias = files.ranks(f"{stem}.attention.query_key_value.bias", (3 * local,), dtype)
        dense = files.ranks(f"{stem}.attention.dense.weight", (local, hidden), dtype)
        up = files.ranks(f"{stem}.mlp.dense_h_to_4h.weight", (hidden, local_inter), dtype)
        up_bias = files.ranks(f"{stem}.mlp.dense_h_to_4h.bias", (local_inter,), dtype)
        down = files.ranks(f"{stem}.mlp.dense_4h_to_h.weight", (local_inter, hidden), dtype)
        dense_bias = files.whole(f"{stem}.attention.dense.bias", (hidden,), dtype)
        down_bias = files.whole(f"{stem}.mlp.dense_4h_to_h.bias", (hidden,), dtype)
        h = x if post_norm else norm(f"{stem}.input_layernorm", x)
        a = (
            x
            + nn.all_reduce(nn.gpt_attention(h, qkv[r], qkv_bias[r], dense[r], head_size=size) for r in range(tp))
            + dense_bias
        )
        if post_norm:
            a = norm(f"{stem}.input_layernorm", a)
        h2 = a if post_norm else norm(f"{stem}.post_attention_layernorm", a)
        x = a + nn.all_reduce(act(h2 @ up[r] + up_bias[r]) @ down[r] for r in range(tp)) + down_bias
        if post_norm:
            x = norm(f"{stem}.post_attention_layernorm", x)
    if ini.flag("has_post_decoder_layernorm", True):
        x = norm("model.final_layernorm", x)
    head = files.whole("model.lm_head.weight", (vocab, hidden), dtype) if files.exists("model.lm_head.weight") else wte
    return x @ head.T


def _layernorm_type(text: str) -> bool:
    """True for ``post_layernorm``, False for ``pre_layernorm`` (FT aborts on anything else)."""
    if text not in ("pre_layernorm", "post_layernorm"):
        raise ConfigError(
            f"[gpt] layernorm_type = {text!r}; FasterTransformer knows pre_layernorm and post_layernorm",
            hint="re-convert the checkpoint with ftx convert",
        )
    return text == "post_layernorm"
