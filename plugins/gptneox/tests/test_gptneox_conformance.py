"""GPT-NeoX passes ftx's family conformance kit, for each residual kind (each selects its own table)."""

from ftx_gptneox.family import GPTNeoX
from ftx_triton.testing.conformance import FamilyConformance
from tiny_configs import NEOX_TINY


class TestGPTNeoXParallel(FamilyConformance):
    """Parallel residual (Pythia, GPT-NeoX-20B): mlp.attention.bias.sum is written."""

    family = GPTNeoX
    tiny_hf_config = NEOX_TINY


class TestGPTNeoXSequential(FamilyConformance):
    """Sequential residual, full rotary, 8 heads of 8."""

    family = GPTNeoX
    tiny_hf_config = {
        **NEOX_TINY,
        "num_attention_heads": 8,
        "intermediate_size": 96,
        "num_hidden_layers": 3,
        "rotary_pct": 1.0,
        "use_parallel_residual": False,
    }
