"""Bad input: a clear error naming the problem and the fix, exit 1, no traceback, nothing written."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import assert_clean_failure
from safetensors.numpy import load_file, save_file


def copy_checkpoint(src: Path, dest: Path, edit=None) -> Path:
    shutil.copytree(src, dest)
    if edit:
        tensors = load_file(dest / "model.safetensors")
        edit(tensors)
        save_file(tensors, dest / "model.safetensors")
    return dest


def no_store_artifacts(home: Path, stage: str) -> bool:
    root = home / "store" / stage
    return not root.exists() or not any(root.iterdir())


def test_unknown_model_lists_presets_and_forms(ftx_cli) -> None:
    result = ftx_cli("run", "no-such-model", "--until", "configure")
    assert_clean_failure(result, "no-such-model", "gptj")


def test_unmapped_tensors_are_named_with_counts(ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    def add_extra(t: dict) -> None:
        for i in range(7):
            t[f"transformer.h.0.attn.extra_{i}.weight"] = np.zeros((2, 2), np.float32)

    src = copy_checkpoint(tiny_gptj_dir, tmp_path / "ckpt", add_extra)
    result = ftx_cli("convert", str(src), "--output", str(tmp_path / "out"))
    assert_clean_failure(result, "7 tensor(s) in the checkpoint are not mapped", "attn.extra_0.weight", "(2 more)")
    assert not (tmp_path / "out" / "1-gpu").exists()


def test_missing_tensors_are_named(ftx_cli, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    src = copy_checkpoint(tiny_gptj_dir, tmp_path / "ckpt", lambda t: t.pop("transformer.h.1.attn.k_proj.weight"))
    result = ftx_cli("convert", str(src), "--output", str(tmp_path / "out"))
    assert_clean_failure(result, "1 tensor(s) the family needs are missing", "transformer.h.1.attn.k_proj.weight")
    assert not (tmp_path / "out" / "1-gpu").exists()


def test_shape_disagreeing_with_config_names_both(ftx_cli, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    src = copy_checkpoint(tiny_gptj_dir, tmp_path / "ckpt")
    config = json.loads((src / "config.json").read_text())
    config["n_inner"] = 128
    (src / "config.json").write_text(json.dumps(config))
    result = ftx_cli("convert", str(src), "--output", str(tmp_path / "out"))
    assert_clean_failure(result, "fc_in.weight has shape [256, 64] but config.json implies [128, 64]")


@pytest.mark.parametrize("tp", ["3", "8"])
def test_tp_not_dividing_heads_fails_before_any_write(
    ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path, tp: str
) -> None:
    result = ftx_cli("run", str(tiny_gptj_dir), "--tp", tp, "--until", "configure")
    assert_clean_failure(result, f"head count = 4 is not divisible by --tp {tp}")
    assert no_store_artifacts(ftx_home, "convert")
    result = ftx_cli("convert", str(tiny_gptj_dir), "--tp", tp, "--output", str(tmp_path / "out"))
    assert_clean_failure(result, "not divisible")
    assert not (tmp_path / "out").exists()


def test_truncated_safetensors_names_file_and_tensor(
    ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path
) -> None:
    src = copy_checkpoint(tiny_gptj_dir, tmp_path / "ckpt")
    weights = src / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    result = ftx_cli("run", str(src), "--until", "convert")
    assert_clean_failure(result, "model.safetensors is truncated: tensor ")
    assert no_store_artifacts(ftx_home, "convert")


def test_garbage_safetensors_header(ftx_cli, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    src = copy_checkpoint(tiny_gptj_dir, tmp_path / "ckpt")
    (src / "model.safetensors").write_bytes(struct.pack("<Q", 10**12) + b"{}")
    result = ftx_cli("convert", str(src), "--output", str(tmp_path / "out"))
    assert_clean_failure(result, "not a readable safetensors file")


def test_truncated_pytorch_bin_names_file(ftx_cli, golden: Path, tmp_path: Path) -> None:
    src = tmp_path / "ckpt"
    src.mkdir()
    shutil.copy(golden / "gptj-fp32" / "hf" / "config.json", src)
    data = (golden / "gptj-fp32" / "hf" / "pytorch_model.bin").read_bytes()
    (src / "pytorch_model.bin").write_bytes(data[: len(data) // 3])
    result = ftx_cli("convert", str(src), "--output", str(tmp_path / "out"))
    assert_clean_failure(result, "pytorch_model.bin cannot be read as a PyTorch checkpoint")
    assert not (tmp_path / "out" / "1-gpu").exists()


def test_output_directory_holding_something_else(ftx_cli, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "out" / "1-gpu"
    target.mkdir(parents=True)
    (target / "notes.txt").write_text("mine")
    result = ftx_cli("convert", str(tiny_gptj_dir), "--output", str(tmp_path / "out"))
    assert_clean_failure(result, "already exists and holds something else", "--overwrite")
    assert (target / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["1-gpu"]


def test_rerunning_convert_into_same_output_is_a_no_op(ftx_cli, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    first = ftx_cli("convert", str(tiny_gptj_dir), "--output", str(tmp_path / "out"))
    assert first.exit_code == 0, first.stderr
    second = ftx_cli("convert", str(tiny_gptj_dir), "--output", str(tmp_path / "out"))
    assert second.exit_code == 0 and "nothing to do" in second.stderr
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["1-gpu"], "nothing beside it (no lock file)"


def test_unknown_model_type_lists_families(ftx_cli, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    src = copy_checkpoint(tiny_gptj_dir, tmp_path / "ckpt")
    config = json.loads((src / "config.json").read_text())
    config.update(model_type="mamba", architectures=["MambaForCausalLM"])
    (src / "config.json").write_text(json.dumps(config))
    result = ftx_cli("convert", str(src), "--output", str(tmp_path / "out"))
    assert_clean_failure(result, "no installed family handles model_type 'mamba'", "gptj", "--family")


def test_a_config_whose_model_type_and_architectures_disagree_names_both(
    ftx_cli, tiny_gptj_dir: Path, tmp_path: Path
) -> None:
    """A GPT-J checkpoint relabelled model_type t5: two families claim it, and the message says why."""
    src = copy_checkpoint(tiny_gptj_dir, tmp_path / "ckpt")
    config = json.loads((src / "config.json").read_text())
    config.update(model_type="t5")
    (src / "config.json").write_text(json.dumps(config))
    result = ftx_cli("convert", str(src), "--output", str(tmp_path / "out"))
    assert_clean_failure(
        result, "several families claim this checkpoint", "model_type 't5'", "GPTJForCausalLM", "gptj, t5", "--family"
    )


@pytest.mark.parametrize("damage", ["remove", "truncate", "add"])
def test_a_damaged_output_of_our_own_is_placed_again(ftx_cli, tiny_gptj_dir: Path, tmp_path: Path, damage: str) -> None:
    """The marker alone once made a rerun say "nothing to do" over an output missing a .bin."""
    out = tmp_path / "out"
    assert ftx_cli("convert", str(tiny_gptj_dir), "--output", str(out)).exit_code == 0
    target = out / "1-gpu"
    before = sorted(p.name for p in target.iterdir())
    victim = next(p for p in sorted(target.glob("*.bin")))
    original = victim.read_bytes()
    if damage == "remove":
        victim.unlink()
    elif damage == "truncate":
        data = victim.read_bytes()
        victim.unlink()  # a new file: the hard link into the store stays intact
        victim.write_bytes(data[:-4])
    else:
        (target / "stray.bin").write_bytes(b"x")
    again = ftx_cli("convert", str(tiny_gptj_dir), "--output", str(out))
    assert again.exit_code == 0 and "placing it again" in again.stderr, again.stderr
    assert sorted(p.name for p in target.iterdir()) == before
    assert victim.read_bytes() == original
