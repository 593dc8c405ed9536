"""FasterTransformer's kernels as plain numpy (float32, one sequence, context phase).

Written by hand rather than with torch so that nothing here can pick up a transformers module:
the oracle is meant to disagree with a wrong conversion, not to repeat it. Activations are
hidden states ``[tokens, width]``; per-head tensors are ``[heads, tokens, head_size]``.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

Array = np.ndarray


def layer_norm(x: Array, gamma: Array, beta: Array, eps: float) -> Array:
    """``invokeGeneralLayerNorm``: mean/variance over the last axis, then ``* gamma + beta``."""
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def t5_layer_norm(x: Array, gamma: Array, eps: float) -> Array:
    """``invokeGeneralT5LayerNorm``: root mean square, no centring, no bias."""
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * gamma


def gelu(x: Array) -> Array:
    """FT's ``GeluActivation``: the tanh approximation (every FT model uses it for "gelu")."""
    return 0.5 * x * (1.0 + np.tanh(np.float32(0.7978845608028654) * (x + np.float32(0.044715) * x * x * x)))


def relu(x: Array) -> Array:
    return np.maximum(x, 0)


def silu(x: Array) -> Array:
    return x / (1.0 + np.exp(-x))


ACTIVATIONS = {"gelu": gelu, "relu": relu, "silu": silu}
"""FT's ``getActivationType`` names (lower-cased) of the plain activations."""

GATED = {
    "geglu": "gelu",
    "gated-gelu": "gelu",
    "reglu": "relu",
    "gated-relu": "relu",
    "siglu": "silu",
    "gated-silu": "silu",
}
"""Gated activation names -> the activation applied to the first branch (``act(x W) * (x W2)``)."""


def heads(x: Array, count: int) -> Array:
    """``[tokens, count * size]`` -> ``[count, tokens, size]``."""
    tokens = x.shape[0]
    return x.reshape(tokens, count, -1).transpose(1, 0, 2)


def merge_heads(x: Array) -> Array:
    """``[count, tokens, size]`` -> ``[tokens, count * size]``."""
    return x.transpose(1, 0, 2).reshape(x.shape[1], -1)


def rotary(x: Array, rotary_dim: int, neox_style: bool) -> Array:
    """FT's rotary embedding of ``x [heads, tokens, size]`` at positions 0, 1, ...

    Pair ``i`` (``0 <= i < rotary_dim / 2``) turns by ``t / 10000^(2i / rotary_dim)``. GPT-J style
    pairs adjacent elements ``(2i, 2i+1)``; NeoX style pairs ``(i, i + rotary_dim/2)``. Elements past
    ``rotary_dim`` are left alone.
    """
    if rotary_dim <= 0:
        return x
    half = rotary_dim // 2
    steps = np.arange(x.shape[1], dtype=np.float32)[:, None]
    inv_freq = 1.0 / np.power(np.float32(10000.0), np.arange(half, dtype=np.float32) * 2 / np.float32(rotary_dim))
    angle = steps * inv_freq  # [tokens, half]
    cos, sin = np.cos(angle), np.sin(angle)
    out = x.copy()
    if neox_style:
        a, b = x[..., :half], x[..., half:rotary_dim]
        out[..., :half] = a * cos - b * sin
        out[..., half:rotary_dim] = b * cos + a * sin
    else:
        a, b = x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
        out[..., 0:rotary_dim:2] = a * cos - b * sin
        out[..., 1:rotary_dim:2] = b * cos + a * sin
    return out


def attention(q: Array, k: Array, v: Array, *, scale: float, causal: bool, bias: Array | None = None) -> Array:
    """Softmax attention of ``q [heads, tq, d]`` over ``k, v [heads, tk, d]``; ``bias [heads, tq, tk]`` is added
    to the scaled scores (T5's relative position bias)."""
    scores = np.einsum("hqd,hkd->hqk", q, k) * np.float32(scale)
    if bias is not None:
        scores = scores + bias
    if causal:
        tq, tk = scores.shape[1:]
        future = np.triu(np.ones((tq, tk), dtype=bool), k=tk - tq + 1)
        scores = np.where(future, np.float32(-1e30), scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    return np.einsum("hqk,hkd->hqd", weights, v)


def gpt_attention(
    h: Array,
    qkv_weight: Array,
    qkv_bias: Array | None,
    out_weight: Array,
    *,
    head_size: int,
    rotary_dim: int = 0,
    neox_style: bool = False,
) -> Array:
    """One rank's share of FT's ``TensorParallelGptContextAttentionLayer`` (GPT, GPT-J, GPT-NeoX).

    ``qkv_weight [H, 3 * H/tp]``: each token's product is laid out ``[3, local heads, head_size]``
    (q of every local head, then k, then v), as ``add_fusedQKV_bias_transpose_kernel`` reads it;
    rotary turns q and k; causal attention scaled by ``1/sqrt(head_size)``; then
    ``out_weight [H/tp, H]``. The caller sums the ranks (the all-reduce) and adds any output bias.
    """
    qkv = h @ qkv_weight
    if qkv_bias is not None:
        qkv = qkv + qkv_bias
    local = qkv.shape[1] // 3
    count = local // head_size
    q, k, v = (heads(qkv[:, i * local : (i + 1) * local], count) for i in range(3))
    q, k = rotary(q, rotary_dim, neox_style), rotary(k, rotary_dim, neox_style)
    context = attention(q, k, v, scale=1.0 / float(np.sqrt(head_size)), causal=True)
    return merge_heads(context) @ out_weight


def all_reduce(parts: Iterable[Array]) -> Array:
    """The ranks' partial results summed (NCCL's all-reduce)."""
    total: Array | None = None
    for part in parts:
        total = part if total is None else total + part
    if total is None:
        raise ValueError("all_reduce of no ranks")
    return total
