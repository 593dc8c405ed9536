"""What FasterTransformer's GPT-style decoders (``gpt``, ``gptj``, ``gptneox``) read alike: the sizes their
config.ini section gives, a layernorm's two files, and one layer's per-rank attention and MLP weights."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ftx_triton.oracle import nn
from ftx_triton.oracle.files import FtFiles, IniSection, split


@dataclass(frozen=True)
class DecoderDims:
    """The sizes of one decoder section, the files' dtype, and each rank's share of the widths."""

    files: FtFiles
    dtype: np.dtype
    head_size: int
    hidden: int
    """``head_num * size_per_head`` (FT's hidden units)."""
    inter: int
    vocab: int
    local: int
    """``hidden / tp``: one rank's attention width."""
    local_inter: int
    """``inter / tp``: one rank's MLP width."""

    @classmethod
    def of(cls, files: FtFiles, ini: IniSection) -> DecoderDims:
        """Read from ``ini`` (``head_num``, ``size_per_head``, ``inter_size``, ``vocab_size``); widths FT would
        split unevenly over ``files.tp`` ranks are refused."""
        heads, head_size = ini.size("head_num"), ini.size("size_per_head")
        hidden, inter, vocab = heads * head_size, ini.size("inter_size"), ini.size("vocab_size")
        return cls(
            files,
            ini.file_dtype(),
            head_size,
            hidden,
            inter,
            vocab,
            split(hidden, files.tp, "head_num * size_per_head"),
            split(inter, files.tp, "inter_size"),
        )

    def whole(self, stem: str, *shape: int) -> np.ndarray:
        """``<stem>.bin`` of ``shape`` in the files' dtype."""
        return self.files.whole(stem, shape, self.dtype)

    def layer_norm(self, stem: str, x: np.ndarray, eps: float) -> np.ndarray:
        """FT's layernorm of ``x`` with ``<stem>.weight`` and ``<stem>.bias``."""
        return nn.layer_norm(x, self.whole(f"{stem}.weight", self.hidden), self.whole(f"{stem}.bias", self.hidden), eps)

    def layer(self, stem: str, *, qkv_bias: bool) -> LayerWeights:
        """Layer ``stem``'s per-rank files (the fused qkv bias only where the model has one)."""
        ranks, dtype = self.files.ranks, self.dtype
        local, local_inter = self.local, self.local_inter
        return LayerWeights(
            qkv=ranks(f"{stem}.attention.query_key_value.weight", (self.hidden, 3 * local), dtype),
            qkv_bias=ranks(f"{stem}.attention.query_key_value.bias", (3 * local,), dtype) if qkv_bias else None,
            dense=ranks(f"{stem}.attention.dense.weight", (local, self.hidden), dtype),
            up=ranks(f"{stem}.mlp.dense_h_to_4h.weight", (self.hidden, local_inter), dtype),
            up_bias=ranks(f"{stem}.mlp.dense_h_to_4h.bias", (local_inter,), dtype),
            down=ranks(f"{stem}.mlp.dense_4h_to_h.weight", (local_inter, self.hidden), dtype),
        )


@dataclass(frozen=True)
class LayerWeights:
    """One layer's attention and MLP files, one array per rank (as rank ``r`` loads them)."""

    qkv: list[np.ndarray]
    qkv_bias: list[np.ndarray] | None
    dense: list[np.ndarray]
    up: list[np.ndarray]
    up_bias: list[np.ndarray]
    down: list[np.ndarray]

    def attention(
        self, h: np.ndarray, rank: int, *, head_size: int, rotary_dim: int = 0, neox_style: bool = False
    ) -> np.ndarray:
        """Rank ``rank``'s attention output (before the all-reduce and the output bias)."""
        bias = None if self.qkv_bias is None else self.qkv_bias[rank]
        return nn.gpt_attention(
            h, self.qkv[rank], bias, self.dense[rank], head_size=head_size, rotary_dim=rotary_dim, neox_style=neox_style
        )

    def mlp(self, h: np.ndarray, rank: int, act: Callable[[np.ndarray], np.ndarray] = nn.gelu) -> np.ndarray:
        """Rank ``rank``'s MLP output (before the all-reduce and the output bias)."""
        return act(h @ self.up[rank] + self.up_bias[rank]) @ self.down[rank]
