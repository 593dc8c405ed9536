"""Tiny KoGPT checkpoints built offline for tests: a random GPT-J (:func:`ftx_gptj.tiny.tiny_gptj`) with a
BPE tokenizer holding KoGPT's special tokens. Needs torch and transformers (imported when built)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ftx_triton.plugin_api import tiny

SPECIALS = ("[BOS]", "[EOS]", "[UNK]", "[PAD]", "[MASK]")
"""KoGPT's special tokens; trained in this order, the tokenizer's ids are [BOS] 0, [EOS] 1, [UNK] 2, [PAD] 3, [MASK] 4."""
TOKEN_IDS = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 3}
"""config.json's ids that agree with :func:`train_kogpt_tokenizer`'s."""


def train_kogpt_tokenizer(dest: Path) -> Any:
    """A BPE tokenizer (tokenizer.json and tokenizer_config.json in ``dest``) with KoGPT's special tokens."""
    names = ("bos_token", "eos_token", "unk_token", "pad_token", "mask_token")
    return tiny.train_bpe_tokenizer(dest, specials=SPECIALS, extra_config=dict(zip(names, SPECIALS, strict=True)))


def tiny_kogpt(
    dest: Path,
    *,
    n_embd: int = 64,
    rotary_dim: int = 4,
    vocab_size: int = 504,
    dtype: str = "float32",
    safetensors: bool = True,
    tokenizer: bool = True,
    token_ids: Mapping[str, int] | None = None,
) -> Path:
    """KoGPT6B's shape scaled down (4 heads, 2 layers, rotary a quarter of the head as in KoGPT6B, vocabulary
    64512 / 128), every parameter drawn at random (seed 7), with :data:`TOKEN_IDS` (or ``token_ids``) in
    config.json and, unless ``tokenizer`` is false, :func:`train_kogpt_tokenizer`'s tokenizer."""
    from ftx_gptj.tiny import tiny_gptj

    tiny_gptj(
        dest,
        n_embd=n_embd,
        n_head=4,
        n_layer=2,
        rotary_dim=rotary_dim,
        vocab_size=vocab_size,
        dtype=dtype,
        safetensors=safetensors,
        tokenizer=False,
        token_ids=token_ids or TOKEN_IDS,
        random_init=True,
        seed=7,
    )
    if tokenizer:
        train_kogpt_tokenizer(dest)
    return dest
