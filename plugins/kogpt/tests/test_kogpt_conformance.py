"""KoGPT passes ftx's family conformance kit (a KoGPT6B-shaped tiny GPT-J: rotary D/4, vocab 64512/128)."""

from ftx_kogpt.family import KoGPT
from ftx_triton.testing.conformance import FamilyConformance


class TestKoGPT(FamilyConformance):
    family = KoGPT
    tiny_hf_config = {
        "model_type": "gptj",
        "n_layer": 2,
        "n_embd": 64,
        "n_head": 4,
        "rotary_dim": 4,
        "vocab_size": 504,
        "n_positions": 64,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 3,
    }
