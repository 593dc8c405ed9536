"""The tiny models core's tests build checkpoints of: config.json contents per family, and the plugin
template's family (the template is not installed here). Each plugin's conformance test states its own."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from ftx_triton.cli.scaffold import TEMPLATE

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
GPT2_TINY = {
    "model_type": "gpt2",
    "n_layer": 2,
    "n_embd": 64,
    "n_head": 4,
    "n_positions": 64,
    "vocab_size": 128,
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
TEMPLATE_FAMILY = TEMPLATE / "src" / "ftx_gpt2" / "family.py"


def template_module() -> Any:
    """The plugin template's family module, imported from its file once."""
    name = "ftx_gpt2_template_family"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, TEMPLATE_FAMILY)
        assert spec is not None and spec.loader is not None
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]
