"""GPT-J (EleutherAI GPT-J-6B and fine-tunes): tensor table and FT hyper-parameters.

Upstream quirks fixed here, each shown by a test: ``inter_size`` honours ``n_inner`` (upstream
always writes ``4 * n_embd``); a null ``rotary_dim`` means rotary over the whole head, so
``rotary_embedding = size_per_head`` (upstream writes ``None``, which FT cannot parse);
``model.wte.bin`` is written once (upstream rewrites it once per layer).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from ftx_triton.plugin_api import (
    ROTARY_GPT_KEYS,
    Family,
    FtIni,
    IniSection,
    M,
    ModelSpec,
    Preset,
    Skip,
    TensorMap,
    TensorReader,
    checked_rotary,
    head_size_of,
    ops,
)

from ftx_gptj import slim
from ftx_gptj.tiny import DEMO

L = "transformer.h.{i}"
FT = "model.layers.{i}"

# fmt: off
TENSORS = TensorMap(
    #  Hugging Face source                         FasterTransformer file stem                  op / split / HF shape
    M("transformer.wte.weight",                    "model.wte",                                   shape=("V", "H")),
    M(f"{L}.ln_1.weight",                          f"{FT}.input_layernorm.weight",                shape=("H",)),
    M(f"{L}.ln_1.bias",                            f"{FT}.input_layernorm.bias",                  shape=("H",)),
    M((f"{L}.attn.q_proj.weight", f"{L}.attn.k_proj.weight", f"{L}.attn.v_proj.weight"),
                                                   f"{FT}.attention.query_key_value.weight",      ops.fuse_qkv, -1, ("H", "H")),
    M(f"{L}.attn.out_proj.weight",                 f"{FT}.attention.dense.weight",                ops.transpose, 0, ("H", "H")),
    M(f"{L}.mlp.fc_in.weight",                     f"{FT}.mlp.dense_h_to_4h.weight",              ops.transpose, -1, ("I", "H")),
    M(f"{L}.mlp.fc_in.bias",                       f"{FT}.mlp.dense_h_to_4h.bias",                ops.identity, -1, ("I",)),
    M(f"{L}.mlp.fc_out.weight",                    f"{FT}.mlp.dense_4h_to_h.weight",              ops.transpose, 0, ("H", "I")),
    # FT adds the FFN output bias once after the all-reduce: full value, one file.
    M(f"{L}.mlp.fc_out.bias",                      f"{FT}.mlp.dense_4h_to_h.bias",                shape=("H",)),
    M("transformer.ln_f.weight",                   "model.final_layernorm.weight",                shape=("H",)),
    M("transformer.ln_f.bias",                     "model.final_layernorm.bias",                  shape=("H",)),
    M("lm_head.weight",                            "model.lm_head.weight",                        shape=("V", "H")),
    M("lm_head.bias",                              "model.lm_head.bias",                          shape=("V",)),
    Skip(f"{L}.attn.bias", f"{L}.attn.masked_bias"),  # causal-mask buffers, not weights
)
# fmt: on


GPTJ_6B_CONFIG = {
    "model_type": "gptj",
    "architectures": ["GPTJForCausalLM"],
    "n_embd": 4096,
    "n_head": 16,
    "n_layer": 28,
    "n_inner": None,
    "rotary_dim": 64,
    "vocab_size": 50400,
    "n_positions": 2048,
    "bos_token_id": 50256,
    "eos_token_id": 50256,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}
"""EleutherAI/gpt-j-6b's config.json (the fields ftx reads), so dry runs plan without a download."""


INI = FtIni(
    sections=(IniSection("gptj", (*ROTARY_GPT_KEYS, "weight_data_type")),),
    hf_fields={
        "n_embd": "H",
        "n_head": "N",
        "n_inner": "I",
        "n_layer": "i",
        "rotary_dim": "rotary_embedding",
        "vocab_size": "V",
        "bos_token_id": "start_id",
        "eos_token_id": "end_id",
    },
    hf_constants={"model_type": "gptj", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": False},
    model_name="gptj",
)
"""``[gptj]``, the section FT's GPT-J model reads (KoGPT too); the name ``gptj`` without ``_name_or_path``."""


class GPTJ(Family):
    """GPT-J: parallel attention + MLP on one layernorm, interleaved rotary, LM head with bias."""

    name = "gptj"
    title = "GPT-J (EleutherAI GPT-J-6B and fine-tunes)"
    hf_model_types: ClassVar[tuple[str, ...]] = ("gptj",)
    hf_architectures: ClassVar[tuple[str, ...]] = ("GPTJForCausalLM",)
    presets = {
        "gptj": Preset(
            "hf://EleutherAI/gpt-j-6b",
            description="GPT-J 6B, Hugging Face weights",
            license="apache-2.0",
            hf_config=GPTJ_6B_CONFIG,
        ),
        "tiny-gptj": Preset(
            "builtin:tiny-gptj", description="a tiny GPT-J built offline at first use (the demo)", builtin=DEMO
        ),
        # The archive the GPT-J guide downloads; its sha256 is not known here, so it is not pinned.
        "gptj-slim": Preset(
            "https://the-eye.eu/public/AI/GPT-J-6B/step_383500_slim.tar.zstd",
            description="GPT-J 6B, original mesh-transformer-jax slim checkpoint (step 383500, bf16, .tar.zstd)",
            license="apache-2.0",
            hf_config={**GPTJ_6B_CONFIG, "torch_dtype": "bfloat16"},
        ),
    }
    tensors = TENSORS
    ini = INI
    triton_model_type = "GPT-J"
    ft_output_dtypes = {"sequence_length": "INT32"}  # FasterTransformer's GPT-J returns INT32 lengths
    hf_model_class = "GPTJForCausalLM"
    fingerprint_modules = ("ftx_gptj.slim",)

    def spec(self, hf_config: Mapping[str, Any]) -> ModelSpec:
        width, heads = int(hf_config["n_embd"]), int(hf_config["n_head"])
        head_size = head_size_of(width, heads, "n_embd", "n_head")
        return ModelSpec(
            dims={
                "H": width,
                "N": heads,
                "D": head_size,
                "I": int(hf_config.get("n_inner") or 4 * width),
                "V": int(hf_config["vocab_size"]),
            },
            layers={"i": int(hf_config["n_layer"])},
            start_id=int(hf_config.get("bos_token_id", 50256)),
            end_id=int(hf_config.get("eos_token_id", 50256)),
            pad_id=hf_config.get("pad_token_id"),
            extra={
                "rotary_embedding": checked_rotary(
                    int(hf_config.get("rotary_dim") or head_size), head_size, "rotary_dim"
                )
            },
        )

    def claims_source(self, path: Path) -> bool:
        """A mesh-transformer-jax slim checkpoint: ``shard_0/0.npz``, and no config.json of another model.

        A config.json beside the shards that only adds what the weights cannot tell (``n_head``,
        ``rotary_dim``; no ``model_type``, or ``gptj``) does not stop the claim. Subclasses
        (KoGPT) inherit the reader but do not claim slim directories.
        """
        if self.name != "gptj" or not slim.is_slim_dir(path):
            return False
        config = Path(path) / "config.json"
        if not config.is_file():
            return True
        try:
            model_type = json.loads(config.read_text()).get("model_type")
        except (ValueError, AttributeError):
            return False
        return model_type in (None, *self.hf_model_types)

    def read_hf_config(self, path: Path) -> dict[str, Any]:
        """config.json, or for a slim checkpoint the config derived from its weights (:func:`slim.read_slim_config`)."""
        if slim.is_slim_dir(path):
            return slim.read_slim_config(path)
        return super().read_hf_config(path)

    def open_weights(self, path: Path) -> TensorReader:
        """The slim reader for a slim checkpoint directory, else the Hugging Face readers."""
        if slim.is_slim_dir(path):
            return slim.SlimCheckpointReader(path)
        return super().open_weights(path)
