"""The FasterTransformer CPU reference (ftx_triton.oracle) catches wrong layouts that the round trip and the
python runtime cannot see, because those invert the very table that wrote the files.

Each wrong table here is a real family plugin with one thing changed, built in the test.
"""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ftini_cases import GPT2_TINY, template_module
from ftx_triton.conversion.convert import convert_directory
from ftx_triton.conversion.tensormap import M, TensorMap
from ftx_triton.errors import CheckpointError
from ftx_triton.oracle import verify
from ftx_triton.oracle.files import FtFiles
from ftx_triton.testing.conformance import TINY_WEIGHT_STD, build_tiny_checkpoint
from tiny_configs import GPTJ_TINY, NEOX_TINY, T5_TINY

pytest_plugins = ["pytester"]


def _swap_fused_sources(row: M, first: int, second: int) -> M:
    sources = list(row.sources)
    sources[first], sources[second] = sources[second], sources[first]
    return dataclasses.replace(row, src=tuple(sources))


def _converted(
    family: Any, config: dict[str, Any], root: Path, tp: int, weight_dtype: str = "fp32"
) -> tuple[Path, Path]:
    checkpoint = build_tiny_checkpoint(family, config, root / "hf", weight_std=TINY_WEIGHT_STD)
    convert_directory(family, checkpoint, root / "ft", tp=tp, weight_dtype=weight_dtype)
    return root / "ft" / f"{tp}-gpu", checkpoint


def test_the_kit_fails_a_gptj_plugin_whose_table_swaps_q_and_k(pytester: pytest.Pytester) -> None:
    """The issue's case, run as a plugin author runs the kit (pytest in a subprocess): with q and k swapped,
    the round trip and python-runtime generation stay green (they invert the same wrong table) and the FT
    reference fails, at tp 1 and tp 2; the unchanged GPT-J beside it passes the same selection."""
    pytester.makepyfile(
        test_swapped=textwrap.dedent("""
        import dataclasses
        from ftx_triton.conversion.tensormap import TensorMap
        from ftx_triton.testing.conformance import FamilyConformance
        from ftx_gptj.family import GPTJ, TENSORS

        def swapped(row):
            if "q_proj" not in str(row.src):
                return row
            q, k, v = row.sources
            return dataclasses.replace(row, src=(k, q, v))

        class SwappedGPTJ(GPTJ):
            tensors = TensorMap(*map(swapped, TENSORS.rows))

        CONFIG = {"model_type": "gptj", "n_layer": 2, "n_embd": 64, "n_head": 4, "rotary_dim": 8,
                  "vocab_size": 128, "n_positions": 64, "bos_token_id": 1, "eos_token_id": 2}

        class TestSwappedGPTJ(FamilyConformance):
            family = SwappedGPTJ
            tiny_hf_config = CONFIG

        class TestGPTJ(FamilyConformance):
            family = GPTJ
            tiny_hf_config = CONFIG
    """)
    )
    result = pytester.runpytest_subprocess(
        "-q", "-p", "no:cacheprovider", "-k", "round_trip or python_runtime or reference"
    )
    result.assert_outcomes(passed=5, failed=1)
    result.stdout.fnmatch_lines(
        ["*FAIL *GPT-J tp=1*", "*FAILED*TestSwappedGPTJ::test_ftx_reference_matches_transformers*"]
    )


@pytest.mark.parametrize("tp", [1, 2])
def test_t5_encoder_q_and_k_files_swapped_fail(tmp_path: Path, tp: int) -> None:
    from ftx_t5.family import T5

    class SwappedT5(T5):
        def tensor_map(self, spec: Any) -> TensorMap:
            rows = list(super().tensor_map(spec).rows)
            q = next(i for i, r in enumerate(rows) if r.dst == "encoder.block.{e}.layer.0.SelfAttention.q.weight")
            k = next(i for i, r in enumerate(rows) if r.dst == "encoder.block.{e}.layer.0.SelfAttention.k.weight")
            rows[q], rows[k] = (
                dataclasses.replace(rows[q], dst=rows[k].dst),
                dataclasses.replace(rows[k], dst=rows[q].dst),
            )
            return TensorMap(*rows)

    directory, checkpoint = _converted(SwappedT5(), T5_TINY, tmp_path, tp)
    verdict = verify(directory, checkpoint, model_class="T5ForConditionalGeneration")
    assert verdict.model_type == "T5" and verdict.tp == tp
    assert not verdict.passed, verdict.describe()
    assert verdict.max_abs_diff > 10 * verdict.tolerance


@pytest.mark.parametrize("tp", [1, 2])
def test_gptneox_fused_qkv_in_gptj_order_fails(tmp_path: Path, tp: int) -> None:
    """NeoX's checkpoint interleaves q, k, v per head; a table that reads them as [q | k | v] blocks (GPT-J's
    order) writes a file FT's NeoX reads differently."""
    from ftx_gptneox import family as neox
    from ftx_triton.conversion import ops

    blocks = ops.Op(
        "blocks",
        forward=lambda xs, ctx: xs[0].T.reshape(xs[0].shape[1], 3, -1),
        shape=lambda shapes, ctx: (shapes[0][1], 3, shapes[0][0] // 3),
        inverse=lambda y, ctx: [y.reshape(y.shape[0], -1).T],
    )

    class BlockNeoX(neox.GPTNeoX):
        def tensor_map(self, spec: Any) -> TensorMap:
            rows = [
                dataclasses.replace(r, op=blocks) if r.op is neox.neox_qkv_weight else r
                for r in super().tensor_map(spec).rows
            ]
            return TensorMap(*rows)

    directory, checkpoint = _converted(BlockNeoX(), NEOX_TINY, tmp_path, tp)
    verdict = verify(directory, checkpoint, model_class="GPTNeoXForCausalLM")
    assert not verdict.passed, verdict.describe()


@pytest.mark.parametrize("weight_dtype", ["fp16", "bf16"])
def test_half_precision_files_pass_with_the_same_tolerance(tmp_path: Path, weight_dtype: str) -> None:
    """transformers runs on weights rounded as the files are, so rounding is not mistaken for a layout error."""
    from ftx_gptneox.family import GPTNeoX

    directory, checkpoint = _converted(GPTNeoX(), NEOX_TINY, tmp_path, 2, weight_dtype)
    verdict = verify(directory, checkpoint, model_class="GPTNeoXForCausalLM")
    assert verdict.weight_dtype == weight_dtype
    assert verdict.passed, verdict.describe()


def test_the_template_gpt2_passes_as_ft_gpt(tmp_path: Path) -> None:
    """FT's GPT model type (multi_gpu_gpt), through the plugin template's GPT-2 family, at tp 2."""
    directory, checkpoint = _converted(template_module().GPT2(), GPT2_TINY, tmp_path, 2)
    verdict = verify(directory, checkpoint, model_class="GPT2LMHeadModel")
    assert verdict.model_type == "GPT" and verdict.passed, verdict.describe()


def test_a_missing_rank_file_is_named(tmp_path: Path) -> None:
    """FasterTransformer would warn and run on uninitialised memory; the reference refuses, naming the file."""
    from ftx_gptj.family import GPTJ

    directory, checkpoint = _converted(GPTJ(), GPTJ_TINY, tmp_path, 2)
    (directory / "model.layers.1.attention.dense.weight.1.bin").unlink()
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.attention\.dense\.weight\.1\.bin is missing"):
        verify(directory, checkpoint)


def test_a_file_of_the_wrong_size_is_named(tmp_path: Path) -> None:
    from ftx_gptj.family import GPTJ

    directory, _ = _converted(GPTJ(), GPTJ_TINY, tmp_path, 1)
    target = directory / "model.lm_head.bias.bin"
    target.write_bytes(target.read_bytes()[:-4])
    files = FtFiles(directory)
    with pytest.raises(
        CheckpointError, match=r"model\.lm_head\.bias\.bin holds 508 bytes; FasterTransformer loads 512"
    ):
        files.whole("model.lm_head.bias", (128,), np.dtype(np.float32))


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("head_num", "0", r"head_num = 0; a size must be at least 1"),
        ("vocab_size", "-3", r"vocab_size = -3; a size must be at least 1"),
        ("rotary_embedding", "7", r"rotary_embedding = 7 is not an even number within the head size 16"),
        ("inter_size", "many", r"inter_size = 'many' is not an integer"),
    ],
)
def test_a_damaged_config_ini_is_refused_with_the_key_named(tmp_path: Path, key: str, value: str, message: str) -> None:
    """A converted directory may come from someone else: its config.ini is checked before any size is used."""
    from ftx_gptj.family import GPTJ
    from ftx_triton.errors import ConfigError

    directory, checkpoint = _converted(GPTJ(), GPTJ_TINY, tmp_path, 1)
    ini = directory / "config.ini"
    lines = [f"{key} = {value}" if line.startswith(f"{key} =") else line for line in ini.read_text().splitlines()]
    ini.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=message):
        verify(directory, checkpoint)


def test_a_t5_start_id_outside_the_vocabulary_is_refused(tmp_path: Path) -> None:
    from ftx_t5.family import T5
    from ftx_triton.errors import ConfigError

    directory, checkpoint = _converted(T5(), T5_TINY, tmp_path, 1)
    ini = directory / "config.ini"
    ini.write_text(ini.read_text().replace("decoder_start_token_id = 0", "decoder_start_token_id = 128"))
    with pytest.raises(ConfigError, match=r"decoder_start_token_id = 128 is outside the vocabulary of 128"):
        verify(directory, checkpoint)


def test_a_named_pipe_in_place_of_a_weight_file_does_not_block(tmp_path: Path) -> None:
    import os

    from ftx_gptj.family import GPTJ

    directory, checkpoint = _converted(GPTJ(), GPTJ_TINY, tmp_path, 1)
    target = directory / "model.final_layernorm.bias.bin"
    target.unlink()
    os.mkfifo(target)
    with pytest.raises(CheckpointError, match=r"final_layernorm\.bias\.bin is a named pipe"):
        verify(directory, checkpoint)


@pytest.mark.parametrize("case", ["gptj-fp32", "gptj-fp16", "gptneox-parallel", "t5-v1_0-tied", "t5-v1_1-tied"])
def test_the_golden_checkpoints_pass_at_tp_2(golden: Path, tmp_path: Path, case: str) -> None:
    """The golden inputs (transformers' default init: small weights, nearly uniform attention): ftx's
    conversions, byte-identical to FasterTransformer's own converter's (the parity tests), pass the reference."""
    import json

    from ftx_triton.cli.common import get_host

    manifest = json.loads((golden / case / "manifest.json").read_text())
    family = get_host().families[manifest["family"]]
    checkpoint = golden / case / manifest["input"]["dir"]
    for weight_dtype in sorted({run["output_dtype"] for run in manifest["runs"]}):
        convert_directory(family, checkpoint, tmp_path / weight_dtype, tp=2, weight_dtype=weight_dtype)
        verdict = verify(tmp_path / weight_dtype / "2-gpu", checkpoint, model_class=family.hf_model_class)
        assert verdict.passed and verdict.weight_dtype == weight_dtype, verdict.describe()


def test_ft_gpt_post_layernorm_relu_without_final_norm_matches_opt(tmp_path: Path) -> None:
    """FT GPT's variant flags (layernorm_type = post_layernorm, activation_type = Relu, learned positions,
    has_post_decoder_layernorm = 0, LM head tied to the embedding): an OPT-350m-shaped checkpoint written in
    FT's layout by this test (no family plugin converts OPT) matches transformers, at tp 2."""
    import torch
    import transformers
    from ftx_triton.formats.ftformat import write_ini, write_tensor
    from ftx_triton.tiny import randomize

    config = transformers.OPTConfig(
        vocab_size=96,
        hidden_size=32,
        word_embed_proj_dim=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        ffn_dim=64,
        max_position_embeddings=32,
        do_layer_norm_before=False,
        activation_function="relu",
    )
    torch.manual_seed(0)
    model = transformers.OPTForCausalLM(config).eval()
    randomize(model, 0, TINY_WEIGHT_STD, around_init=True)
    model.save_pretrained(tmp_path / "hf")
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    out, tp, hidden = tmp_path / "2-gpu", 2, 32
    out.mkdir()
    write_ini(
        out / "config.ini",
        {
            "gpt": {
                "model_name": "opt",
                "head_num": 4,
                "size_per_head": 8,
                "inter_size": 64,
                "num_layer": 2,
                "vocab_size": 96,
                "max_pos_seq_len": 32,
                "start_id": 2,
                "end_id": 2,
                "layernorm_eps": 1e-5,
                "layernorm_type": "post_layernorm",
                "activation_type": "Relu",
                "has_post_decoder_layernorm": 0,
                "weight_data_type": "fp32",
            }
        },
    )
    d = "model.decoder"
    write_tensor(out / "model.wte.bin", weights[f"{d}.embed_tokens.weight"])
    write_tensor(out / "model.wpe.bin", weights[f"{d}.embed_positions.weight"][2:])  # OPT's offset of 2
    for i in range(2):
        hf, ft = f"{d}.layers.{i}", f"model.layers.{i}"
        qkv = np.stack([weights[f"{hf}.self_attn.{n}_proj.weight"].T for n in "qkv"], axis=1)  # [H, 3, H]
        qkv_bias = np.stack([weights[f"{hf}.self_attn.{n}_proj.bias"] for n in "qkv"])  # [3, H]
        whole = {
            "input_layernorm.weight": f"{hf}.self_attn_layer_norm.weight",
            "input_layernorm.bias": f"{hf}.self_attn_layer_norm.bias",
            "post_attention_layernorm.weight": f"{hf}.final_layer_norm.weight",
            "post_attention_layernorm.bias": f"{hf}.final_layer_norm.bias",
            "attention.dense.bias": f"{hf}.self_attn.out_proj.bias",
            "mlp.dense_4h_to_h.bias": f"{hf}.fc2.bias",
        }
        for name, source in whole.items():
            write_tensor(out / f"{ft}.{name}.bin", weights[source])
        for r in range(tp):
            cols, inner = slice(r * hidden // tp, (r + 1) * hidden // tp), slice(r * 32, (r + 1) * 32)
            write_tensor(out / f"{ft}.attention.query_key_value.weight.{r}.bin", qkv[:, :, cols])
            write_tensor(out / f"{ft}.attention.query_key_value.bias.{r}.bin", qkv_bias[:, cols])
            write_tensor(
                out / f"{ft}.attention.dense.weight.{r}.bin", weights[f"{hf}.self_attn.out_proj.weight"].T[cols]
            )
            write_tensor(out / f"{ft}.mlp.dense_h_to_4h.weight.{r}.bin", weights[f"{hf}.fc1.weight"].T[:, inner])
            write_tensor(out / f"{ft}.mlp.dense_h_to_4h.bias.{r}.bin", weights[f"{hf}.fc1.bias"][inner])
            write_tensor(out / f"{ft}.mlp.dense_4h_to_h.weight.{r}.bin", weights[f"{hf}.fc2.weight"].T[inner])
    verdict = verify(out, tmp_path / "hf", model_class="OPTForCausalLM")
    assert verdict.model_type == "GPT" and verdict.passed, verdict.describe()
    assert verdict.max_abs_diff < 1e-3 * verdict.scale


def test_the_kit_round_trip_accepts_a_declared_lossy_row_and_only_that(pytester: pytest.Pytester) -> None:
    """FasterTransformer drops the first two rows of OPT's position table, so a correct table has no exact
    inverse: a row whose op declares the loss (``ops.drop_rows``: ``kept_rows``) passes the round trip, which
    checks the kept rows exactly; the same loss undeclared fails it (here on GPT-J's embedding table)."""
    pytester.makepyfile(
        test_lossy=textwrap.dedent("""
        import dataclasses
        from ftx_triton.conversion import ops
        from ftx_triton.conversion.tensormap import TensorMap
        from ftx_triton.testing.conformance import FamilyConformance
        from ftx_gptj.family import GPTJ, TENSORS

        DECLARED = ops.drop_rows(2)
        UNDECLARED = dataclasses.replace(DECLARED, name="undeclared", kept_rows=None)

        def lossy(op):
            rows = [dataclasses.replace(r, op=op) if r.dst == "model.wte" else r for r in TENSORS.rows]
            return TensorMap(*rows)

        class DeclaredGPTJ(GPTJ):
            tensors = lossy(DECLARED)

        class UndeclaredGPTJ(GPTJ):
            tensors = lossy(UNDECLARED)

        CONFIG = {"model_type": "gptj", "n_layer": 2, "n_embd": 64, "n_head": 4, "rotary_dim": 8,
                  "vocab_size": 128, "n_positions": 64, "bos_token_id": 1, "eos_token_id": 2}

        class TestDeclared(FamilyConformance):
            family = DeclaredGPTJ
            tiny_hf_config = CONFIG

        class TestUndeclared(FamilyConformance):
            family = UndeclaredGPTJ
            tiny_hf_config = CONFIG
    """)
    )
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", "-k", "round_trip")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*FAILED*TestUndeclared::test_round_trip_returns_the_original_tensors*"])
