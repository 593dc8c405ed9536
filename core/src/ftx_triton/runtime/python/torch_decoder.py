"""Decoder-only language models in plain torch, computing what ``transformers`` computes without importing it.

Importing transformers' modeling code takes seconds (``modeling_utils`` pulls in ``torch._dynamo`` and
``torch.distributed.tensor``), more than building a model from the converted files. The python runtime builds
these modules instead when the architecture is one of :data:`ARCHITECTURES` (keyed by the ``model_type`` a
family's ``hf_config_from_ini`` gives back, so every family of that architecture shares it: GPT-J and KoGPT
use ``gptj``, GPT-NeoX ``gpt_neox``). Each module names its parameters as the Hugging Face checkpoint does,
so the family's inverted tensor table fills it directly, and runs the operations of transformers' forward
(4.57) in the same order and dtypes: fp32 logits equal transformers' to the last bit on the CPU.

* ``gptj`` (``GPTJForCausalLM``, eager attention): interleaved rotary on the first ``rotary_dim`` features,
  attention scores in fp32 plus an additive mask, attention and MLP in parallel on one layernorm, LM head
  with bias, logits in fp32.
* ``gpt_neox`` (``GPTNeoXForCausalLM``, SDPA attention): fused head-interleaved QKV, half-split rotary on
  ``rotary_pct`` of each head, parallel or sequential residual (``use_parallel_residual``), LM head
  ``embed_out`` without bias, applied to the last position only (as ``generate`` asks with ``logits_to_keep``).

The KV cache is :class:`KVCache` (keys and values contiguous, growing by concatenation, as transformers'
``DynamicCache``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

ROTARY_BASE = 10000.0


@dataclass(frozen=True)
class DecoderConfig:
    """The hyper-parameters a decoder is built from (what the generation code reads of a model's config)."""

    model_type: str
    vocab_size: int
    hidden: int
    heads: int
    layers: int
    inner: int
    rotary_dim: int
    max_position_embeddings: int
    activation: str
    eps: float = 1e-5
    parallel_residual: bool = True
    is_encoder_decoder: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": lambda x: 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0)))),
    "gelu_fast": lambda x: 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x))),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}
"""transformers' ``ACT2FN`` entries these models may name, each the same formula."""


def config_of(hf: Mapping[str, Any], max_positions: int | None = None) -> DecoderConfig | None:
    """The :class:`DecoderConfig` of a Hugging Face config dict (as ``Family.hf_config_from_ini`` rebuilds it),
    or None when no plain module covers it (another architecture, an unknown activation, tied embeddings,
    rotary scaling): the runtime then builds transformers' model."""
    model_type = hf.get("model_type")
    try:
        if model_type == "gptj":
            hidden, heads = int(hf["n_embd"]), int(hf["n_head"])
            rotary = hf.get("rotary_dim")
            config = DecoderConfig(
                "gptj",
                int(hf["vocab_size"]),
                hidden,
                heads,
                int(hf["n_layer"]),
                int(hf.get("n_inner") or 4 * hidden),
                int(rotary) if rotary else 0,
                int(max_positions or hf.get("n_positions") or 2048),
                str(hf.get("activation_function") or "gelu_new"),
                float(hf.get("layer_norm_epsilon", 1e-5)),
            )
        elif model_type == "gpt_neox":
            hidden, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
            base = float(hf.get("rotary_emb_base", hf.get("rope_theta", ROTARY_BASE)))
            if base != ROTARY_BASE or hf.get("rope_scaling") or hf.get("attention_bias", True) is False:
                return None
            config = DecoderConfig(
                "gpt_neox",
                int(hf["vocab_size"]),
                hidden,
                heads,
                int(hf["num_hidden_layers"]),
                int(hf["intermediate_size"]),
                int(hidden // heads * float(hf.get("rotary_pct", 0.25))),
                int(max_positions or hf.get("max_position_embeddings") or 2048),
                str(hf.get("hidden_act") or "gelu"),
                float(hf.get("layer_norm_eps", 1e-5)),
                bool(hf.get("use_parallel_residual", True)),
            )
        else:
            return None
    except (KeyError, TypeError, ValueError):
        return None
    if hf.get("tie_word_embeddings") or config.activation not in ACTIVATIONS or not 0 < config.rotary_dim:
        return None
    if config.hidden % config.heads or config.rotary_dim > config.head_dim or config.rotary_dim % 2:
        return None
    return config


class Linear(nn.Module):
    """``nn.Linear``'s parameters and forward, without its initialisation: on the meta device ``nn.Linear`` draws
    its random weights through torch's reference kernels, which import ``torch._dynamo`` (1.7 s)."""

    def __init__(self, inputs: int, outputs: int, bias: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(outputs, inputs))
        self.bias = nn.Parameter(torch.empty(outputs)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class Embedding(nn.Module):
    """``nn.Embedding``'s parameter and forward, without its initialisation (see :class:`Linear`)."""

    def __init__(self, rows: int, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, width))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class LayerNorm(nn.Module):
    """``nn.LayerNorm``'s parameters and forward, without its initialisation (see :class:`Linear`)."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(width))
        self.bias = nn.Parameter(torch.empty(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (self.weight.shape[0],), self.weight, self.bias, self.eps)


@dataclass
class KVCache:
    """Per layer the keys and values [B, heads, tokens, head_dim] seen so far."""

    layers: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)

    @property
    def length(self) -> int:
        return self.layers[0][0].shape[-2] if self.layers else 0

    def update(self, index: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this step's keys and values of layer ``index``; all of the layer's so far.

        The first step's are stored contiguous, as ``DynamicCache`` stores them (it concatenates them onto an
        empty tensor): the attention matmul's rounding follows its operands' layout on some CPUs (MKL on AVX2
        rounds ``query @ key.T`` differently for a permuted ``key``)."""
        if index == len(self.layers):
            self.layers.append((keys.contiguous(), values.contiguous()))
        else:
            old_keys, old_values = self.layers[index]
            self.layers[index] = (torch.cat([old_keys, keys], dim=-2), torch.cat([old_values, values], dim=-2))
        return self.layers[index]


class CausalDecoder(nn.Module):
    """What every architecture shares: the forward over new tokens with a cache, returning the last logits."""

    config: DecoderConfig
    is_plain_torch = True
    """Marks the models :class:`~.generation.Generator` decodes with :class:`~.torch_model.TorchDecoder`."""
    head_on_every_position = False
    """transformers applies GPT-J's head to every position (its rounding follows that matmul's shape)."""

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def blocks(self) -> nn.ModuleList:
        raise NotImplementedError

    def final(self, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def attention_mask(self, mask: torch.Tensor, cache_position: torch.Tensor, dtype: torch.dtype) -> Any:
        raise NotImplementedError

    def rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def forward(
        self, input_ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor, cache: KVCache
    ) -> torch.Tensor:
        """Logits [B, V] of the last of ``input_ids`` [B, S] (positions [B, S]); ``attention`` [B, cached + S]
        is 1 for real tokens, 0 for padding. The cache gains the new tokens' keys and values."""
        past = cache.length
        cache_position = torch.arange(past, past + input_ids.shape[1], device=input_ids.device)
        hidden = self.embed(input_ids)
        mask = self.attention_mask(attention, cache_position, hidden.dtype)
        rotary = self.rotary(positions, hidden.dtype)
        for index, block in enumerate(self.blocks()):
            hidden = block(hidden, mask, rotary, cache, index)
        if self.head_on_every_position:
            return self.final(hidden)[:, -1, :]
        return self.final(hidden[:, -1:, :])[:, -1, :]


# --------------------------------------------------------------------------- GPT-J


def _rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    return torch.stack((-x[:, :, :, 1::2], x[:, :, :, ::2]), dim=-1).flatten(-2)


def _rotary_every_two(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    sin = torch.repeat_interleave(sin[:, :, None, :], 2, 3)
    cos = torch.repeat_interleave(cos[:, :, None, :], 2, 3)
    return (x * cos) + (_rotate_every_two(x) * sin)


def _sinusoids(positions: int, dim: int) -> torch.Tensor:
    """GPT-J's table [positions, dim] of sines then cosines, made as transformers makes it (under the default
    dtype, on the CPU)."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu") / dim))
    angles = torch.einsum("i , j -> i j", torch.arange(positions, dtype=torch.int64, device="cpu").float(), inv_freq)
    return torch.cat((torch.sin(angles.float()), torch.cos(angles.float())), dim=1)


class _GPTJAttention(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.heads, self.head_dim, self.rotary_dim = config.heads, config.head_dim, config.rotary_dim
        self.scale = torch.sqrt(torch.tensor(self.head_dim, dtype=torch.float32, device="cpu")).to(
            torch.get_default_dtype()
        )
        self.q_proj = Linear(config.hidden, config.hidden, bias=False)
        self.k_proj = Linear(config.hidden, config.hidden, bias=False)
        self.v_proj = Linear(config.hidden, config.hidden, bias=False)
        self.out_proj = Linear(config.hidden, config.hidden, bias=False)

    def forward(
        self, hidden: torch.Tensor, mask: torch.Tensor, rotary: Any, cache: KVCache, index: int
    ) -> torch.Tensor:
        batch, length = hidden.shape[:2]
        split = (batch, length, self.heads, self.head_dim)
        query, key = self.q_proj(hidden).view(split), self.k_proj(hidden).view(split)
        value = self.v_proj(hidden).view(split).permute(0, 2, 1, 3)
        sin, cos = (t.to(key.dtype) for t in rotary)
        r = self.rotary_dim
        key = torch.cat([_rotary_every_two(key[:, :, :, :r], sin, cos), key[:, :, :, r:]], dim=-1).permute(0, 2, 1, 3)
        query = torch.cat([_rotary_every_two(query[:, :, :, :r], sin, cos), query[:, :, :, r:]], dim=-1)
        query = query.permute(0, 2, 1, 3)
        key, value = cache.update(index, key, value)
        scores = torch.matmul(query.to(torch.float32), key.to(torch.float32).transpose(-1, -2)) / self.scale
        weights = F.softmax(scores + mask[:, :, :, : key.shape[-2]], dim=-1).to(value.dtype)
        out = torch.matmul(weights, value).permute(0, 2, 1, 3).contiguous()
        return self.out_proj(out.view(batch, length, self.heads * self.head_dim))


class _GPTJMLP(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.fc_in = Linear(config.hidden, config.inner)
        self.fc_out = Linear(config.inner, config.hidden)
        self.act = ACTIVATIONS[config.activation]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.fc_out(self.act(self.fc_in(hidden)))


class _GPTJBlock(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(config.hidden, eps=config.eps)
        self.attn = _GPTJAttention(config)
        self.mlp = _GPTJMLP(config)

    def forward(self, hidden: torch.Tensor, mask: Any, rotary: Any, cache: KVCache, index: int) -> torch.Tensor:
        normed = self.ln_1(hidden)
        return self.attn(normed, mask, rotary, cache, index) + self.mlp(normed) + hidden


class _GPTJBody(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.wte = Embedding(config.vocab_size, config.hidden)
        self.h = nn.ModuleList(_GPTJBlock(config) for _ in range(config.layers))
        self.ln_f = LayerNorm(config.hidden, eps=config.eps)


class GPTJ(CausalDecoder):
    """transformers' ``GPTJForCausalLM`` (eager attention), parameters named as its checkpoints."""

    head_on_every_position = True
    sinusoids: torch.Tensor

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = _GPTJBody(config)
        self.lm_head = Linear(config.hidden, config.vocab_size)
        self.register_buffer("sinusoids", _sinusoids(config.max_position_embeddings, config.rotary_dim), False)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.transformer.wte(input_ids)

    def blocks(self) -> nn.ModuleList:
        return self.transformer.h

    def final(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.transformer.ln_f(hidden)).to(torch.float32)

    def attention_mask(self, mask: torch.Tensor, cache_position: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """transformers' 4D additive mask [B, 1, S, T]: 0 where a token may attend, the dtype's minimum where the
        key is later than the query or padding."""
        low = torch.finfo(dtype).min
        keys = torch.arange(mask.shape[-1], device=mask.device)
        blocked = (keys[None, :] > cache_position[:, None])[None, None] | (mask[:, None, None, :] == 0)
        return torch.zeros(blocked.shape, dtype=dtype, device=mask.device).masked_fill(blocked, low)

    def rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        sincos = self.sinusoids[positions]
        sin, cos = torch.split(sincos, sincos.shape[-1] // 2, dim=-1)
        return sin, cos


# --------------------------------------------------------------------------- GPT-NeoX


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _NeoXAttention(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.heads, self.head_dim, self.rotary_dim = config.heads, config.head_dim, config.rotary_dim
        self.scaling = self.head_dim**-0.5
        self.query_key_value = Linear(config.hidden, 3 * config.hidden)
        self.dense = Linear(config.hidden, config.hidden)

    def forward(self, hidden: torch.Tensor, mask: Any, rotary: Any, cache: KVCache, index: int) -> torch.Tensor:
        batch, length = hidden.shape[:2]
        qkv = self.query_key_value(hidden).view(batch, length, -1, 3 * self.head_dim).transpose(1, 2)
        query, key, value = qkv.chunk(3, dim=-1)
        cos, sin = (t.unsqueeze(1) for t in rotary)
        r = self.rotary_dim
        query = torch.cat([query[..., :r] * cos + _rotate_half(query[..., :r]) * sin, query[..., r:]], dim=-1)
        key = torch.cat([key[..., :r] * cos + _rotate_half(key[..., :r]) * sin, key[..., r:]], dim=-1)
        key, value = cache.update(index, key, value)
        mask, causal = mask
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=0.0, scale=self.scaling, is_causal=causal and length > 1
        )
        return self.dense(out.transpose(1, 2).contiguous().reshape(batch, length, -1).contiguous())


class _NeoXMLP(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.dense_h_to_4h = Linear(config.hidden, config.inner)
        self.dense_4h_to_h = Linear(config.inner, config.hidden)
        self.act = ACTIVATIONS[config.activation]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(self.act(self.dense_h_to_4h(hidden)))


class _NeoXLayer(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.parallel = config.parallel_residual
        self.input_layernorm = LayerNorm(config.hidden, eps=config.eps)
        self.post_attention_layernorm = LayerNorm(config.hidden, eps=config.eps)
        self.attention = _NeoXAttention(config)
        self.mlp = _NeoXMLP(config)

    def forward(self, hidden: torch.Tensor, mask: Any, rotary: Any, cache: KVCache, index: int) -> torch.Tensor:
        attended = self.attention(self.input_layernorm(hidden), mask, rotary, cache, index)
        if self.parallel:
            return self.mlp(self.post_attention_layernorm(hidden)) + attended + hidden
        attended = attended + hidden
        return self.mlp(self.post_attention_layernorm(attended)) + attended


class _NeoXBody(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.embed_in = Embedding(config.vocab_size, config.hidden)
        self.layers = nn.ModuleList(_NeoXLayer(config) for _ in range(config.layers))
        self.final_layer_norm = LayerNorm(config.hidden, eps=config.eps)


class GPTNeoX(CausalDecoder):
    """transformers' ``GPTNeoXForCausalLM`` (SDPA attention), parameters named as its checkpoints."""

    inv_freq: torch.Tensor

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.gpt_neox = _NeoXBody(config)
        self.embed_out = Linear(config.hidden, config.vocab_size, bias=False)
        dim = config.rotary_dim
        inv_freq = 1.0 / (ROTARY_BASE ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))
        self.register_buffer("inv_freq", inv_freq, False)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.gpt_neox.embed_in(input_ids)

    def blocks(self) -> nn.ModuleList:
        return self.gpt_neox.layers

    def final(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.embed_out(self.gpt_neox.final_layer_norm(hidden))

    def attention_mask(self, mask: torch.Tensor, cache_position: torch.Tensor, dtype: torch.dtype) -> Any:
        """SDPA's mask as transformers hands it: none (SDPA's own causal flag) when nothing is padded and the
        queries are one token or the whole sequence, else a boolean [B, 1, S, T] (True = attend)."""
        queries, keys = cache_position.shape[0], mask.shape[-1]
        if bool(mask.all()) and (queries == 1 or queries == keys):
            return None, True
        allowed = torch.arange(keys, device=mask.device)[None, :] <= cache_position[:, None]
        return allowed[None, None] & mask.bool()[:, None, None, :], False

    def rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = self.inv_freq[None, :, None].float().expand(positions.shape[0], -1, 1)
        freqs = (inv_freq @ positions[:, None, :].float()).transpose(1, 2)
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


ARCHITECTURES: dict[str, type[CausalDecoder]] = {"gptj": GPTJ, "gpt_neox": GPTNeoX}
"""Plain modules by the ``model_type`` of the config a family rebuilds from config.ini."""
