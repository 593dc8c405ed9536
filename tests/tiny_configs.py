"""config.json of the tiny GPT-J, T5 and GPT-NeoX models that the plugins' conformance tests and core's
reference and ``ftx verify`` tests build (the template's GPT-2 is in :mod:`ftini_cases`)."""

from __future__ import annotations

GPTJ_TINY = {
    "model_type": "gptj",
    "n_layer": 2,
    "n_embd": 64,
    "n_head": 4,
    "rotary_dim": 8,
    "vocab_size": 128,
    "n_positions": 64,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
T5_TINY = {
    "model_type": "t5",
    "vocab_size": 128,
    "relative_attention_num_buckets": 32,
    "decoder_start_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 0,
    "d_model": 64,
    "d_kv": 16,
    "num_heads": 4,
    "d_ff": 128,
    "num_layers": 2,
    "feed_forward_proj": "relu",
    "tie_word_embeddings": True,
}
NEOX_TINY = {
    "model_type": "gpt_neox",
    "vocab_size": 128,
    "max_position_embeddings": 64,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "rotary_pct": 0.25,
    "use_parallel_residual": True,
}
