"""Tiny GPT-NeoX checkpoints built offline for tests. Needs torch and transformers (imported when built)."""

from __future__ import annotations

from pathlib import Path

from ftx_triton.plugin_api import tiny


def tiny_gptneox(
    dest: Path,
    *,
    num_hidden_layers: int = 2,
    hidden_size: int = 64,
    num_attention_heads: int = 4,
    rotary_pct: float = 0.25,
    use_parallel_residual: bool = True,
    vocab_size: int = 256,
    intermediate_size: int = 256,
    dtype: str = "float32",
    safetensors: bool = True,
    tokenizer: bool = True,
    random_init: bool = False,
    seed: int = 0,
) -> Path:
    """A random GPTNeoXForCausalLM saved with save_pretrained (and a trained tokenizer).

    ``random_init`` draws every parameter (biases and layernorms too) at random.
    """
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    eos = tiny.end_of_text_id(dest, vocab_size, tokenizer=tokenizer)
    config = GPTNeoXConfig(
        num_hidden_layers=num_hidden_layers,
        hidden_size=hidden_size,
        num_attention_heads=num_attention_heads,
        rotary_pct=rotary_pct,
        use_parallel_residual=use_parallel_residual,
        vocab_size=vocab_size,
        intermediate_size=intermediate_size,
        max_position_embeddings=256,
        bos_token_id=eos,
        eos_token_id=eos,
        tie_word_embeddings=False,
    )
    tiny.seeded(seed)
    model = GPTNeoXForCausalLM(config).eval()
    return tiny.save_model(tiny.randomize(model, seed) if random_init else model, dest, dtype, safetensors)
