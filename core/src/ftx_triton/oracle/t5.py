"""FasterTransformer's T5 (``models/t5``: T5Encoder + T5Decoding) on CPU, from its converted files.

What FT's Triton T5 reads: ``[encoder]``/``[decoder]`` sizes, ``feed_forward_proj`` of the encoder
(the activation of both stacks), ``[structure]`` ``use_gated_activation`` (whether ``wi2`` files are
loaded), ``t5_with_bias`` and ``position_embedding_type``, and ``[decoder] tie_word_embeddings``
(default true). RMS layernorm with eps 1e-6 (FT's constant); no attention scaling
(``q_scaling = 1/sqrt(d_kv)`` cancels it); relative position buckets with
``max_distance = 128`` (hard-coded in FT), bidirectional in the encoder and causal in the decoder,
from ``block.0``'s per-rank table ``[heads/tp, buckets]``; the LM head is ``lm_head.weight`` when
present, else ``shared.weight_T``, scaled by ``1/sqrt(d_model)`` when embeddings are tied.
T5 with biases (``t5_with_bias``) and absolute positions are refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from ftx_triton.errors import ConfigError
from ftx_triton.oracle import nn
from ftx_triton.oracle.files import FtFiles, IniSection, split

LAYERNORM_EPS = 1e-6
MAX_DISTANCE = 128


def buckets(query: int, key: int, num_buckets: int, bidirectional: bool) -> np.ndarray:
    """``buildRelativeAttentionBias``'s bucket of each (query, key) position pair, ``[query, key]``."""
    relative = np.arange(key)[None, :] - np.arange(query)[:, None]
    out = np.zeros_like(relative)
    n = num_buckets
    if bidirectional:
        n //= 2
        out += np.where(relative > 0, n, 0)
    relative = np.abs(relative)
    exact = n // 2
    with np.errstate(divide="ignore"):
        large = exact + (
            np.log(np.maximum(relative, 1).astype(np.float32) / exact) / math.log(MAX_DISTANCE / exact) * (n - exact)
        ).astype(np.int64)
    large = np.minimum(large, n - 1)
    return out + np.where(relative < exact, relative, large)


class _Stack:
    """One stack's sizes and files."""

    def __init__(self, files: FtFiles, ini: IniSection, prefix: str) -> None:
        self.files, self.prefix, self.dtype = files, prefix, ini.file_dtype()
        self.heads, self.size, self.hidden = ini.size("num_heads"), ini.size("d_kv"), ini.size("d_model")
        self.inter, self.layers = ini.size("d_ff"), ini.integer("num_layers")
        self.buckets = ini.size("relative_attention_num_buckets_or_max_pos_seq_len")
        tp = files.tp
        self.local_heads = split(self.heads, tp, f"[{ini.name}] num_heads")
        self.local = self.local_heads * self.size
        self.local_inter = split(self.inter, tp, f"[{ini.name}] d_ff")

    def norm(self, stem: str, x: np.ndarray) -> np.ndarray:
        return nn.t5_layer_norm(
            x, self.files.whole(f"{self.prefix}{stem}.weight", (self.hidden,), self.dtype), LAYERNORM_EPS
        )

    def ranks(self, stem: str, shape: tuple[int, ...]) -> list[np.ndarray]:
        return self.files.ranks(f"{self.prefix}{stem}", shape, self.dtype)

    def position_bias(self, query: int, key: int, bidirectional: bool) -> list[np.ndarray]:
        """Each rank's ``[local heads, query, key]`` bias."""
        tables = self.ranks(
            "block.0.layer.0.SelfAttention.relative_attention_bias.weight", (self.local_heads, self.buckets)
        )
        index = buckets(query, key, self.buckets, bidirectional)
        return [table[:, index] for table in tables]

    def ffn(self, block: str, h: np.ndarray, act: Callable[[np.ndarray], np.ndarray], gated: bool) -> np.ndarray:
        wi = self.ranks(f"{block}.DenseReluDense.wi.weight", (self.hidden, self.local_inter))
        wi2 = self.ranks(f"{block}.DenseReluDense.wi2.weight", (self.hidden, self.local_inter)) if gated else None
        wo = self.ranks(f"{block}.DenseReluDense.wo.weight", (self.local_inter, self.hidden))
        return nn.all_reduce(
            (act(h @ wi[r]) * (h @ wi2[r]) if wi2 is not None else act(h @ wi[r])) @ wo[r] for r in range(len(wi))
        )


def _attend(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, heads: int, *, causal: bool, bias: np.ndarray | None
) -> np.ndarray:
    return nn.merge_heads(
        nn.attention(nn.heads(q, heads), nn.heads(k, heads), nn.heads(v, heads), scale=1.0, causal=causal, bias=bias)
    )


def logits(files: FtFiles, input_ids: Sequence[int], decoder_input_ids: Sequence[int]) -> np.ndarray:
    """``[decoder tokens, vocab]`` logits of ``decoder_input_ids`` given the encoder's ``input_ids``."""
    structure = files.optional_section("structure")
    if structure.flag("t5_with_bias", False):
        raise ConfigError(
            "the reference does not model T5 with biases (t5_with_bias)", hint="ftx verify cannot check this model"
        )
    if structure.text("position_embedding_type", "relative") != "relative":
        raise ConfigError(
            "the reference models T5 with relative positions only", hint="ftx verify cannot check this model"
        )
    gated_files = structure.flag("use_gated_activation", False)
    enc_ini, dec_ini = files.section("encoder"), files.section("decoder")
    activation = enc_ini.text("feed_forward_proj").lower()
    gated = activation in nn.GATED
    act = nn.ACTIVATIONS.get(nn.GATED.get(activation, activation))
    if act is None:
        raise ConfigError(
            f"[encoder] feed_forward_proj = {activation!r} is no activation FasterTransformer's T5 runs",
            hint="re-convert the checkpoint with ftx convert",
        )
    if gated != gated_files:
        raise ConfigError(
            f"[encoder] feed_forward_proj = {activation!r} but [structure] use_gated_activation = "
            f"{gated_files}: FasterTransformer would load one set of FFN weights and run the other",
            hint="re-convert the checkpoint with ftx convert",
        )
    enc, dec = _Stack(files, enc_ini, "encoder."), _Stack(files, dec_ini, "decoder.")
    vocab, tp = dec_ini.size("vocab_size"), files.tp
    shared = files.whole("shared.weight_T", (vocab, enc.hidden), enc.dtype)

    # encoder
    x = shared[np.asarray(input_ids)]
    tokens = len(input_ids)
    bias = enc.position_bias(tokens, tokens, bidirectional=True)
    for layer in range(enc.layers):
        block = f"block.{layer}.layer"
        h = enc.norm(f"{block}.0.layer_norm", x)
        q, k, v, o = (
            enc.ranks(f"{block}.0.SelfAttention.{n}.weight", shape)
            for n, shape in (
                ("q", (enc.hidden, enc.local)),
                ("k", (enc.hidden, enc.local)),
                ("v", (enc.hidden, enc.local)),
                ("o", (enc.local, enc.hidden)),
            )
        )
        x = x + nn.all_reduce(
            _attend(h @ q[r], h @ k[r], h @ v[r], enc.local_heads, causal=False, bias=bias[r]) @ o[r] for r in range(tp)
        )
        x = x + enc.ffn(f"{block}.1", enc.norm(f"{block}.1.layer_norm", x), act, gated)
    memory = enc.norm("final_layer_norm", x)

    # decoder
    y = files.whole("shared.weight_T", (vocab, dec.hidden), dec.dtype)[np.asarray(decoder_input_ids)]
    steps = len(decoder_input_ids)
    bias = dec.position_bias(steps, steps, bidirectional=False)
    for layer in range(dec.layers):
        block = f"block.{layer}.layer"
        h = dec.norm(f"{block}.0.layer_norm", y)
        qkv = dec.ranks(f"{block}.0.SelfAttention.qkv.weight", (dec.hidden, 3 * dec.local))
        o = dec.ranks(f"{block}.0.SelfAttention.o.weight", (dec.local, dec.hidden))

        def self_attention(r: int) -> np.ndarray:
            fused = h @ qkv[r]  # noqa: B023 - per token [3, local heads, d_kv]
            q, k, v = (fused[:, i * dec.local : (i + 1) * dec.local] for i in range(3))
            return _attend(q, k, v, dec.local_heads, causal=True, bias=bias[r]) @ o[r]  # noqa: B023

        y = y + nn.all_reduce(self_attention(r) for r in range(tp))
        h = dec.norm(f"{block}.1.layer_norm", y)
        q, k, v = (
            dec.ranks(f"{block}.1.EncDecAttention.{n}.weight", (enc.hidden if n != "q" else dec.hidden, dec.local))
            for n in "qkv"
        )
        o = dec.ranks(f"{block}.1.EncDecAttention.o.weight", (dec.local, dec.hidden))
        y = y + nn.all_reduce(
            _attend(h @ q[r], memory @ k[r], memory @ v[r], dec.local_heads, causal=False, bias=None) @ o[r]
            for r in range(tp)
        )
        y = y + dec.ffn(f"{block}.2", dec.norm(f"{block}.2.layer_norm", y), act, gated)
    y = dec.norm("final_layer_norm", y)
    head = (
        files.whole("lm_head.weight", (vocab, dec.hidden), dec.dtype)
        if files.exists("lm_head.weight")
        else files.whole("shared.weight_T", (vocab, dec.hidden), dec.dtype)
    )
    scale = 1.0 / math.sqrt(dec.hidden) if dec_ini.flag("tie_word_embeddings", True) else 1.0
    return (y @ head.T) * np.float32(scale)
