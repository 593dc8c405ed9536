"""KoGPT: a GPT-J subclass — same bytes as GPT-J, its own preset, licence and tokenizer-checked ids."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import ftx_kogpt.family
import ftx_kogpt.tiny
import numpy as np
import pytest
from ftx_gptj.family import GPTJ
from ftx_kogpt.family import KoGPT
from ftx_triton.conversion.convert import convert_directory, invert_checkpoint
from ftx_triton.conversion.tokenizer_ids import tokenizer_token_ids
from ftx_triton.errors import ConfigError
from ftx_triton.formats.checkpoint import open_checkpoint
from ftx_triton.formats.ftformat import read_ini
from ftx_triton.testing.golden import GoldenRun, ini_mismatches, load_runs, mismatches
from repo_paths import GOLDEN_DIR


def _gptj_runs() -> list[GoldenRun]:
    root = GOLDEN_DIR
    return [run for case in ("gptj-fp32", "gptj-fp16") for run in load_runs(root / case)]


def _convert(family: GPTJ, src: Path, out: Path, *, tp: int, weight_dtype: str = "fp32") -> Path:
    return convert_directory(family, src, out, tp=tp, weight_dtype=weight_dtype).directory


def _tiny_kogpt(dest: Path, **changes: Any) -> Path:
    """:func:`ftx_kogpt.tiny.tiny_kogpt` in fp16 pytorch_model.bin, like the KoGPT6B-ryan1.5b-float16 branch."""
    return ftx_kogpt.tiny.tiny_kogpt(dest, **{"dtype": "float16", "safetensors": False, **changes})


@pytest.fixture(scope="module")
def tiny_kogpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny_kogpt(tmp_path_factory.mktemp("kogpt") / "hf")


# -- parity with GPT-J ------------------------------------------------------------------------------


@pytest.mark.parametrize("run", _gptj_runs(), ids=lambda r: r.id)
def test_kogpt_matches_upstream_gptj_bytes(golden: Path, tmp_path: Path, run: GoldenRun) -> None:
    """KoGPT is converted by upstream's GPT-J converter unchanged: same golden bytes, same [gptj] ini."""
    _convert(KoGPT(), golden / run.case / "hf", tmp_path, tp=run.tp, weight_dtype=run.dtype)
    assert mismatches(tmp_path, run) == []
    assert ini_mismatches(tmp_path, run) == []


@pytest.mark.parametrize("weight_dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("tp", [1, 2])
def test_kogpt_shaped_checkpoint_converts_like_gptj(
    tiny_kogpt: Path, tmp_path: Path, tp: int, weight_dtype: str
) -> None:
    ours = _convert(KoGPT(), tiny_kogpt, tmp_path / "kogpt", tp=tp, weight_dtype=weight_dtype)
    theirs = _convert(GPTJ(), tiny_kogpt, tmp_path / "gptj", tp=tp, weight_dtype=weight_dtype)
    names = sorted(p.name for p in theirs.iterdir())
    assert sorted(p.name for p in ours.iterdir()) == names
    for name in names:
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
    ini = read_ini(ours / "config.ini")["gptj"]
    assert (ini["vocab_size"], ini["rotary_embedding"], ini["start_id"], ini["end_id"]) == ("504", "4", "0", "1")


@pytest.mark.parametrize("tp", [1, 2])
def test_kogpt_round_trip_is_exact(tmp_path: Path, tp: int) -> None:
    src = _tiny_kogpt(tmp_path / "hf", dtype="float32", safetensors=True)
    ft_dir = _convert(KoGPT(), src, tmp_path / "ft", tp=tp)
    reader = open_checkpoint(src)
    original = {n: reader.read(n) for n in reader.names() if not n.endswith(("attn.bias", "attn.masked_bias"))}
    rebuilt = dict(invert_checkpoint(KoGPT(), ft_dir))
    assert set(rebuilt) == set(original)
    for name, tensor in original.items():
        np.testing.assert_array_equal(rebuilt[name], tensor, err_msg=name)


def test_kogpt_subclasses_gptj_without_copying_it() -> None:
    assert issubclass(KoGPT, GPTJ)
    assert KoGPT.tensors is GPTJ.tensors
    for method in ("spec", "config_ini", "hf_config_from_ini", "open_weights"):
        assert getattr(KoGPT, method) is getattr(GPTJ, method), method
    assert KoGPT.ini is GPTJ.ini and KoGPT.ini.required_sections() == ("gptj",)
    assert (KoGPT.triton_model_type, KoGPT.triton_io) == ("GPT-J", "decoder")
    source = inspect.getsource(ftx_kogpt.family)
    assert "TensorMap(" not in source and "M(" not in source


# -- tokenizer ids ------------------------------------------------------------------------------------


def test_tokenizer_ids_agree_with_config(tiny_kogpt: Path) -> None:
    assert tokenizer_token_ids(tiny_kogpt, KoGPT.special_tokens) == {"bos": 0, "eos": 1, "pad": 3}
    spec = KoGPT().spec(KoGPT().read_hf_config(tiny_kogpt))
    assert (spec.start_id, spec.end_id, spec.pad_id) == (0, 1, 3)


def test_config_ids_that_disagree_with_the_tokenizer_are_corrected(tmp_path: Path, log_events) -> None:
    """The tokenizer wins: FT must stop at the tokenizer's [EOS] and start from its [BOS]. A config.json
    that says otherwise (here GPT-J's default 50256 for both, with pad 1) is corrected, with a warning."""
    src = _tiny_kogpt(tmp_path / "hf", token_ids={"bos_token_id": 50256, "eos_token_id": 50256, "pad_token_id": 1})
    assert json.loads((src / "config.json").read_text())["eos_token_id"] == 50256
    ft_dir = _convert(KoGPT(), src, tmp_path / "ft", tp=1)
    ini = read_ini(ft_dir / "config.ini")["gptj"]
    assert (ini["start_id"], ini["end_id"]) == ("0", "1")
    corrected = {
        (e["config_key"], e["config_id"], e["tokenizer_id"]) for e in log_events if e["event"] == "token_ids.corrected"
    }
    assert corrected == {("bos_token_id", 50256, 0), ("eos_token_id", 50256, 1), ("pad_token_id", 1, 3)}
    assert all(e["log_level"] == "warning" for e in log_events if e["event"] == "token_ids.corrected")


def test_a_tokenizer_without_the_kogpt_specials_is_an_error(tmp_path: Path) -> None:
    from ftx_triton.tiny import train_bpe_tokenizer

    src = _tiny_kogpt(tmp_path / "hf", tokenizer=False)
    train_bpe_tokenizer(src)  # a GPT-2 style tokenizer: only <|endoftext|>
    with pytest.raises(ConfigError, match=r"no token for bos '\[BOS\]', eos '\[EOS\]', pad '\[PAD\]'") as info:
        KoGPT().read_hf_config(src)
    assert "--family" in info.value.hint


def test_without_a_tokenizer_the_config_ids_are_used(tmp_path: Path) -> None:
    src = _tiny_kogpt(tmp_path / "hf", tokenizer=False, token_ids={"bos_token_id": 5, "eos_token_id": 6})
    spec = KoGPT().spec(KoGPT().read_hf_config(src))
    assert (spec.start_id, spec.end_id) == (5, 6)


def test_cli_convert_with_family_kogpt(tiny_kogpt: Path, tmp_path: Path, ftx_cli) -> None:
    args = ("convert", str(tiny_kogpt), "--family", "kogpt", "--tp", "2", "-o", str(tmp_path / "out"))
    refused = ftx_cli(*args)  # the family's CC-BY-NC-ND licence needs an explicit acceptance
    assert refused.exit_code == 1 and "--accept-license" in refused.stderr
    result = ftx_cli(*args, "--accept-license")
    assert result.exit_code == 0, result.stderr
    ini = read_ini(tmp_path / "out" / "2-gpu" / "config.ini")["gptj"]
    assert (ini["start_id"], ini["end_id"], ini["vocab_size"]) == ("0", "1", "504")


# -- preset, licence, discovery ---------------------------------------------------------------------------


def test_models_lists_kogpt_with_its_preset(ftx_cli) -> None:
    result = ftx_cli("models", "--json")
    assert result.exit_code == 0, result.stderr
    rows = {row["family"]: row for row in json.loads(result.stdout)}
    assert rows["kogpt"]["presets"] == {
        "kogpt": {
            "source": "hf://kakaobrain/kogpt",
            "revision": "KoGPT6B-ryan1.5b-float16",
            "license": "CC-BY-NC-ND-4.0",
        }
    }
    assert rows["kogpt"]["distribution"] == "ftx-triton-kogpt"
    assert rows["kogpt"]["model_type"] == "GPT-J" and rows["kogpt"]["hf_model_types"] == []


def test_kogpt_never_claims_generic_gptj_checkpoints(golden: Path, plugin_host) -> None:
    family, _ = plugin_host.family_for_source(golden / "gptj-fp32" / "hf")
    assert family.name == "gptj"
    family, _ = plugin_host.family_for_source(golden / "gptj-fp32" / "hf", "kogpt")
    assert family.name == "kogpt"


def test_preset_shows_the_licence_and_pins_the_revision(plugin_host, log_events) -> None:
    from ftx_triton.engine.sources import resolve_source
    from ftx_triton.plan.settings import RunSettings

    ref, family = resolve_source(RunSettings.of("kogpt"), plugin_host)
    assert family == "kogpt"
    assert (ref.uri, ref.revision) == ("hf://kakaobrain/kogpt", "KoGPT6B-ryan1.5b-float16")
    notices = [e for e in log_events if e["event"] == "license.notice"]
    assert notices and notices[0]["license"] == "CC-BY-NC-ND-4.0"
    assert KoGPT.license == "CC-BY-NC-ND-4.0"


def test_preset_config_plans_kogpt6b_offline() -> None:
    family = KoGPT()
    hf_config = family.presets["kogpt"].hf_config
    assert hf_config is not None
    spec = family.spec(hf_config)
    ini = family.config_ini(spec, hf_config, "fp16")["gptj"]
    assert {
        k: ini[k] for k in ("head_num", "size_per_head", "inter_size", "num_layer", "rotary_embedding", "vocab_size")
    } == {
        "head_num": 16,
        "size_per_head": 256,
        "inter_size": 16384,
        "num_layer": 28,
        "rotary_embedding": 64,
        "vocab_size": 64512,
    }
    assert family.gemm_args(spec, batch=8, beam=1, max_input_len=32, data_type="fp16", tp=2) == [
        "8",
        "1",
        "32",
        "16",
        "256",
        "16384",
        "64512",
        "1",
        "2",
    ]
    for tp in (1, 2, 4, 8):
        spec.check_parallel(tp, 1)
