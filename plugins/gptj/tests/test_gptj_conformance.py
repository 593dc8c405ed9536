"""GPT-J passes ftx's family conformance kit."""

from ftx_gptj.family import GPTJ
from ftx_triton.testing.conformance import FamilyConformance


class TestGPTJ(FamilyConformance):
    family = GPTJ
    tiny_hf_config = {
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
