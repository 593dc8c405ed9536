"""T5 passes ftx's family conformance kit, for each table variant."""

from ftx_t5.family import T5
from ftx_triton.testing.conformance import FamilyConformance

BASE = {
    "model_type": "t5",
    "vocab_size": 128,
    "relative_attention_num_buckets": 32,
    "decoder_start_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 0,
}


class TestT5ReluTied(FamilyConformance):
    """v1.0: relu FFN, LM head tied to shared.weight (saved without lm_head.weight)."""

    family = T5
    tiny_hf_config = {
        **BASE,
        "d_model": 64,
        "d_kv": 16,
        "num_heads": 4,
        "d_ff": 128,
        "num_layers": 2,
        "feed_forward_proj": "relu",
        "tie_word_embeddings": True,
    }


class TestT5GatedUntied(FamilyConformance):
    """v1.1 / Flan: gated-gelu FFN, separate LM head, 3 encoder / 1 decoder blocks, N*D != d_model."""

    family = T5
    tiny_hf_config = {
        **BASE,
        "d_model": 48,
        "d_kv": 8,
        "num_heads": 4,
        "d_ff": 96,
        "num_layers": 3,
        "num_decoder_layers": 1,
        "feed_forward_proj": "gated-gelu",
        "tie_word_embeddings": False,
    }
