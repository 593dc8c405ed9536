"""Tiny GPT-J checkpoints built offline: random ones for tests (:func:`tiny_gptj`) and the built-in ``tiny-gptj``
(:data:`DEMO`), a 2-layer GPT-J trained for a few seconds on the built-in corpus so that its greedy continuation of
"Once upon a time" reads as words. Needs torch and transformers (imported when a model is built)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ftx_triton.plugin_api import BuiltinModel, tiny

RECIPE: dict[str, Any] = {
    "vocab_size": 400,
    "n_layer": 2,
    "n_embd": 128,
    "n_head": 4,
    "rotary_dim": 16,
    "n_positions": 256,
    "steps": 60,
    "batch": 16,
    "window": 64,
    "lr": 3e-3,
    "seed": 0,
}


def build_demo(dest: Path) -> Mapping[str, Any]:
    """Train and save the built-in tiny GPT-J into ``dest`` (deterministic; offline)."""
    from transformers import GPTJConfig, GPTJForCausalLM

    r = RECIPE
    tokenizer = tiny.train_bpe_tokenizer(dest, vocab_size=r["vocab_size"])
    eos = tokenizer.token_to_id(tiny.END_OF_TEXT)
    ids = tiny.training_ids(tokenizer, eos)
    config = GPTJConfig(
        n_layer=r["n_layer"],
        n_embd=r["n_embd"],
        n_head=r["n_head"],
        rotary_dim=r["rotary_dim"],
        vocab_size=tokenizer.get_vocab_size(),
        n_positions=r["n_positions"],
        bos_token_id=eos,
        eos_token_id=eos,
        tie_word_embeddings=False,
    )
    loss = tiny.train_causal_lm(lambda: GPTJForCausalLM(config), ids, dest, r, pad_id=eos)
    return {
        "final_loss": loss,
        "description": "tiny GPT-J trained for a few seconds on ftx's built-in corpus (ftx_gptj.tiny)",
    }


DEMO = BuiltinModel(build_demo, RECIPE, version=1, about="first use only: trains a tiny GPT-J offline, about 10 s")
"""The ``tiny-gptj`` preset's recipe (bump ``version`` when the recipe changes: older builds are rebuilt)."""


def tiny_gptj(
    dest: Path,
    *,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    rotary_dim: int | None = 8,
    vocab_size: int = 256,
    n_inner: int | None = None,
    dtype: str = "float32",
    safetensors: bool = True,
    tokenizer: bool = True,
    token_ids: Mapping[str, int] | None = None,
    random_init: bool = False,
    seed: int = 0,
) -> Path:
    """A random GPTJForCausalLM saved with save_pretrained (and a trained tokenizer).

    ``token_ids`` overrides config.json ids (``{"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 3}``);
    by default bos and eos are the tokenizer's end-of-text id (0 without a tokenizer). ``random_init``
    draws every parameter (biases and layernorms too) at random.
    """
    from transformers import GPTJConfig, GPTJForCausalLM

    eos = tiny.end_of_text_id(dest, vocab_size, tokenizer=tokenizer)
    ids = {"bos_token_id": eos, "eos_token_id": eos, **(token_ids or {})}
    config = GPTJConfig(
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        rotary_dim=rotary_dim,
        vocab_size=vocab_size,
        n_inner=n_inner,
        n_positions=256,
        tie_word_embeddings=False,
        **ids,
    )
    tiny.seeded(seed)
    model = GPTJForCausalLM(config).eval()
    return tiny.save_model(tiny.randomize(model, seed) if random_init else model, dest, dtype, safetensors)
