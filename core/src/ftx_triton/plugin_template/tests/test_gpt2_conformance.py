"""The template family passes ftx's conformance kit (the only test file a plugin needs)."""

from ftx_gpt2.family import GPT2
from ftx_triton.testing.conformance import FamilyConformance


class TestGPT2(FamilyConformance):
    family = GPT2
    tiny_hf_config = {
        "model_type": "gpt2",
        "n_layer": 2,
        "n_embd": 64,
        "n_head": 4,
        "n_positions": 64,
        "vocab_size": 128,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
