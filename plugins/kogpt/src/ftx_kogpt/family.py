"""KoGPT (kakaobrain/kogpt): a GPT-J with its own tokenizer, special tokens, revision and licence.

Everything FasterTransformer sees is GPT-J's: the same table, the ``[gptj]`` config.ini section
(FT's GPT-J model reads that section) and Triton model type ``GPT-J``. KoGPT only declares data.
The one behaviour it adds is generic core logic (:mod:`ftx_triton.conversion.tokenizer_ids`): when the checkpoint has
a ``tokenizer.json``, ``start_id``/``end_id``/``pad_id`` are the tokenizer's ids of ``[BOS]``,
``[EOS]`` and ``[PAD]``; a config.json that disagrees is corrected with a warning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ftx_gptj.family import GPTJ
from ftx_triton.plugin_api import Preset, reconcile_token_ids

LICENSE = "CC-BY-NC-ND-4.0"

KOGPT6B_CONFIG = {
    # KoGPT6B-ryan1.5b (model card): GPT-J shaped, 28 x 4096, 16 heads of 256,
    # FFN 16384, rotary 64, vocab 64512, context 2048, distributed in fp16 on this revision.
    "model_type": "gptj",
    "architectures": ["GPTJForCausalLM"],
    "n_embd": 4096,
    "n_head": 16,
    "n_layer": 28,
    "n_inner": 16384,
    "rotary_dim": 64,
    "vocab_size": 64512,
    "n_positions": 2048,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    # Assumed ids of [BOS], [EOS], [PAD] (unverified; a real conversion takes them from the tokenizer).
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 3,
}


class KoGPT(GPTJ):
    """KoGPT 6B: GPT-J architecture, Korean tokenizer with [BOS]/[EOS]/[PAD] specials, non-commercial licence."""

    name = "kogpt"
    title = "KoGPT (KakaoBrain, Korean GPT-J)"
    # Never claim generic GPT-J checkpoints: KoGPT is chosen by its preset or --family kogpt.
    hf_model_types = ()
    hf_architectures = ()
    license = LICENSE
    presets = {
        "kogpt": Preset(
            "hf://kakaobrain/kogpt",
            revision="KoGPT6B-ryan1.5b-float16",
            description="KoGPT 6B (ryan1.5b), fp16 branch",
            license=LICENSE,
            hf_config=KOGPT6B_CONFIG,
        )
    }
    special_tokens = {"bos": "[BOS]", "eos": "[EOS]", "pad": "[PAD]"}

    def read_hf_config(self, path: Path) -> dict[str, Any]:
        return reconcile_token_ids(self.name, self.special_tokens, path, super().read_hf_config(path))
