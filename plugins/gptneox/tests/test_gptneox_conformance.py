"""GPT-NeoX passes ftx's family conformance kit, for each residual kind (each selects its own table)."""

from ftx_gptneox.family import GPTNeoX
from ftx_triton.testing.conformance import FamilyConformance

BASE = {
    "model_type": "gpt_neox",
    "vocab_size": 128,
    "max_position_embeddings": 64,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}


class TestGPTNeoXParallel(FamilyConformance):
    """Parallel residual (Pythia, GPT-NeoX-20B): mlp.attention.bias.sum is written."""

    family = GPTNeoX
    tiny_hf_config = {
        **BASE,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "rotary_pct": 0.25,
        "use_parallel_residual": True,
    }


class TestGPTNeoXSequential(FamilyConformance):
    """Sequential residual, full rotary, 8 heads of 8."""

    family = GPTNeoX
    tiny_hf_config = {
        **BASE,
        "hidden_size": 64,
        "num_attention_heads": 8,
        "intermediate_size": 96,
        "num_hidden_layers": 3,
        "rotary_pct": 1.0,
        "use_parallel_residual": False,
    }
