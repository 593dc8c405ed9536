"""T5 passes ftx's family conformance kit, for each table variant."""

from ftx_t5.family import T5
from ftx_triton.testing.conformance import FamilyConformance
from tiny_configs import T5_TINY


class TestT5ReluTied(FamilyConformance):
    """v1.0: relu FFN, LM head tied to shared.weight (saved without lm_head.weight)."""

    family = T5
    tiny_hf_config = T5_TINY


class TestT5GatedUntied(FamilyConformance):
    """v1.1 / Flan: gated-gelu FFN, separate LM head, 3 encoder / 1 decoder blocks, N*D != d_model."""

    family = T5
    tiny_hf_config = {
        **T5_TINY,
        "d_model": 48,
        "d_kv": 8,
        "d_ff": 96,
        "num_layers": 3,
        "num_decoder_layers": 1,
        "feed_forward_proj": "gated-gelu",
        "tie_word_embeddings": False,
    }
