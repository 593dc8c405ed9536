"""config.ini cases of every family (inputs only): config.json contents x weight dtypes.

``tests/ftini_snapshot.json`` holds, per case, the config.ini text and the Hugging Face config
read back from it, captured from the hand-written ``config_ini``/``hf_config_from_ini`` methods
the families had before core's one writer and reader (:mod:`ftx_triton.conversion.ftini`) replaced them.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftx_triton.cli.scaffold import TEMPLATE

GOLDEN = Path(__file__).resolve().parent / "golden"
TEMPLATE_FAMILY = TEMPLATE / "src" / "ftx_gpt2" / "family.py"
SNAPSHOT = Path(__file__).resolve().parent / "ftini_snapshot.json"


@dataclass(frozen=True)
class IniCase:
    id: str
    family: str
    weight_dtype: str
    hf_config: dict[str, Any] | None = None
    preset: str | None = None
    golden: str | None = None
    """A golden input directory (``gptj-fp32/hf``): config.json read the family's way (slim included)."""


def _golden_json(case: str) -> dict[str, Any]:
    return json.loads((GOLDEN / case / "hf" / "config.json").read_text())


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

CASES: tuple[IniCase, ...] = (
    IniCase("gptj-preset-fp16", "gptj", "fp16", preset="gptj"),
    IniCase("gptj-golden-fp32", "gptj", "fp32", golden="gptj-fp32/hf"),
    IniCase(
        "gptj-inner-null-rotary-bf16",
        "gptj",
        "bf16",
        {
            "model_type": "gptj",
            "n_embd": 64,
            "n_head": 4,
            "n_layer": 3,
            "n_inner": 96,
            "rotary_dim": None,
            "vocab_size": 300,
            "bos_token_id": 7,
            "eos_token_id": 9,
            "pad_token_id": 3,
            "_name_or_path": "org/my-gptj",
        },
    ),
    IniCase("gptj-slim-fp16", "gptj", "fp16", golden="gptj_slim-fp16/slim"),
    IniCase("kogpt-preset-fp16", "kogpt", "fp16", preset="kogpt"),
    IniCase(
        "kogpt-unnamed-fp32",
        "kogpt",
        "fp32",
        {
            "model_type": "gptj",
            "n_embd": 32,
            "n_head": 2,
            "n_layer": 1,
            "rotary_dim": 4,
            "vocab_size": 64,
            "bos_token_id": 0,
            "eos_token_id": 1,
            "pad_token_id": 3,
        },
    ),
    IniCase("gptneox-preset-fp16", "gptneox", "fp16", preset="gptneox"),
    IniCase("gptneox-20b-bf16", "gptneox", "bf16", preset="gpt-neox-20b"),
    IniCase(
        "gptneox-sequential-full-rotary-fp32",
        "gptneox",
        "fp32",
        {
            "model_type": "gpt_neox",
            "hidden_size": 48,
            "num_attention_heads": 6,
            "intermediate_size": 100,
            "num_hidden_layers": 3,
            "partial_rotary_factor": 1.0,
            "vocab_size": 90,
            "use_parallel_residual": False,
            "hidden_act": "gelu_new",
            "bos_token_id": 2,
            "eos_token_id": 3,
            "_name_or_path": "pythia-tiny",
        },
    ),
    IniCase("gptneox-golden-fp32", "gptneox", "fp32", golden="gptneox-parallel/hf"),
    IniCase("t5-preset-fp16", "t5", "fp16", preset="t5"),
    IniCase("flan-t5-xl-bf16", "t5", "bf16", preset="flan-t5-xl"),
    IniCase(
        "t5-unequal-gated-silu-fp32",
        "t5",
        "fp32",
        {
            "model_type": "t5",
            "d_model": 48,
            "d_kv": 8,
            "num_heads": 4,
            "d_ff": 96,
            "num_layers": 3,
            "num_decoder_layers": 1,
            "vocab_size": 120,
            "feed_forward_proj": "gated-silu",
            "tie_word_embeddings": False,
            "relative_attention_num_buckets": 16,
            "relative_attention_max_distance": 64,
            "layer_norm_epsilon": 1e-5,
            "decoder_start_token_id": 0,
            "eos_token_id": 1,
            "pad_token_id": 0,
            "_name_or_path": "my-t5",
        },
    ),
    IniCase("t5-golden-v1_0", "t5", "fp32", golden="t5-v1_0-tied/hf"),
    IniCase("t5-golden-v1_1-fp16", "t5", "fp16", golden="t5-v1_1-tied/hf"),
    IniCase("gpt2-tiny-fp32", "gpt2", "fp32", GPT2_TINY),
    IniCase(
        "gpt2-eps-inner-fp16",
        "gpt2",
        "fp16",
        {**GPT2_TINY, "n_inner": 200, "layer_norm_epsilon": 1e-6, "_name_or_path": "distilgpt2"},
    ),
)


def template_module() -> Any:
    """The plugin template's family module, imported from its file (the template is not installed here)."""
    name = "ftx_gpt2_template_family"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, TEMPLATE_FAMILY)
        assert spec is not None and spec.loader is not None
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


def family_of(name: str) -> Any:
    if name == "gpt2":
        return template_module().GPT2()
    from ftx_triton.plugins import load_host

    return load_host().family(name)


def hf_config_of(case: IniCase, family: Any) -> dict[str, Any]:
    if case.golden is not None:
        return family.read_hf_config(GOLDEN / case.golden)
    if case.preset is not None:
        return dict(family.presets[case.preset].hf_config)
    return dict(case.hf_config or {})


def snapshot() -> dict[str, dict[str, Any]]:
    return json.loads(SNAPSHOT.read_text())


UPSTREAM = {
    "gptj-fp32": "gptj",
    "gptj_slim-fp16": "gptj",
    "gptneox-parallel": "gptneox",
    "t5-v1_0-tied": "t5",
    "t5-v1_1-tied": "t5",
}
"""Golden cases whose upstream-written config.ini (first run) the reader must understand, by family."""


def upstream_ini_text(case: str) -> str:
    return json.loads((GOLDEN / case / "manifest.json").read_text())["runs"][0]["config_ini"]
