"""``ftx verify``: a model name or a converted directory checked against FasterTransformer's math on CPU
(no GPU here, and CUDA hidden from the command to be sure)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ftx_triton.testing.conformance import TINY_WEIGHT_STD, build_tiny_checkpoint
from tiny_configs import GPTJ_TINY

NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}


@pytest.fixture(scope="module")
def gptj_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ftx_gptj.family import GPTJ

    return build_tiny_checkpoint(GPTJ(), GPTJ_TINY, tmp_path_factory.mktemp("gptj") / "hf", weight_std=TINY_WEIGHT_STD)


def _converted(ftx_cli: Any, checkpoint: Path, out: Path, tp: int) -> Path:
    result = ftx_cli("convert", str(checkpoint), "--tp", str(tp), "--output", str(out))
    assert result.exit_code == 0, result.stderr
    return out / f"{tp}-gpu"


def _swap_q_and_k(directory: Path, tp: int, hidden: int = 64) -> None:
    """What a table with q and k swapped writes: each rank's fused [H, 3, H/tp] file with blocks 0 and 1 exchanged."""
    for layer in range(2):
        for rank in range(tp):
            path = directory / f"model.layers.{layer}.attention.query_key_value.weight.{rank}.bin"
            fused = np.fromfile(path, dtype=np.float32).reshape(hidden, 3, hidden // tp)
            fused[:, [0, 1]] = fused[:, [1, 0]]
            fused.tofile(path)


def test_a_model_is_converted_and_passes(ftx_cli: Any, gptj_checkpoint: Path) -> None:
    result = ftx_cli("verify", str(gptj_checkpoint), "--tp", "2", env=NO_GPU)
    assert result.exit_code == 0, result.stderr
    (line,) = result.stdout.splitlines()
    assert line.startswith("PASS ") and "GPT-J tp=2 fp32" in line and "max |FT reference - transformers| = " in line


def test_a_converted_output_is_checked_against_the_source_ftx_convert_recorded(
    ftx_cli: Any, gptj_checkpoint: Path, tmp_path: Path
) -> None:
    out = tmp_path / "ft"
    _converted(ftx_cli, gptj_checkpoint, out, 2)
    _converted(ftx_cli, gptj_checkpoint, out, 1)
    result = ftx_cli("verify", str(out), env=NO_GPU)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [["PASS", str(out / "1-gpu")], ["PASS", str(out / "2-gpu")]]


def test_swapped_q_and_k_fail_with_a_hint_and_exit_1(ftx_cli: Any, gptj_checkpoint: Path, tmp_path: Path) -> None:
    directory = _converted(ftx_cli, gptj_checkpoint, tmp_path / "ft", 2)
    _swap_q_and_k(directory, 2)
    result = ftx_cli("verify", str(directory), env=NO_GPU)
    assert result.exit_code == 1
    (line,) = result.stdout.splitlines()
    assert line.startswith(f"FAIL  {directory}  GPT-J tp=2 fp32: max |FT reference - transformers| = ")
    assert "error: 1 of 1 converted directory would not compute what transformers computes" in result.stderr
    assert "hint: the family's tensor table puts a tensor where FasterTransformer does not read it" in result.stderr


def test_a_directory_without_its_source_needs_checkpoint(ftx_cli: Any, gptj_checkpoint: Path, tmp_path: Path) -> None:
    placed = _converted(ftx_cli, gptj_checkpoint, tmp_path / "ft", 1)
    bare = tmp_path / "elsewhere" / "1-gpu"
    shutil.copytree(placed, bare)
    (bare / "ftx-convert.json").unlink()
    refused = ftx_cli("verify", str(bare), env=NO_GPU)
    assert refused.exit_code == 1 and refused.stdout == ""
    assert "does not say which checkpoint it was converted from" in refused.stderr
    assert "hint: pass the original Hugging Face checkpoint with --checkpoint DIR" in refused.stderr
    given = ftx_cli("verify", str(bare), "--checkpoint", str(gptj_checkpoint), env=NO_GPU)
    assert given.exit_code == 0 and given.stdout.startswith("PASS "), given.stderr


def test_a_recorded_source_that_is_gone_is_not_trusted(ftx_cli: Any, gptj_checkpoint: Path, tmp_path: Path) -> None:
    directory = _converted(ftx_cli, gptj_checkpoint, tmp_path / "ft", 1)
    marker = directory / "ftx-convert.json"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "source": str(tmp_path / "gone")}))
    result = ftx_cli("verify", str(directory), env=NO_GPU)
    assert result.exit_code == 1 and "--checkpoint DIR" in result.stderr


def test_checkpoint_with_a_model_to_convert_is_refused(ftx_cli: Any, gptj_checkpoint: Path) -> None:
    result = ftx_cli("verify", "tiny-gptj", "--checkpoint", str(gptj_checkpoint), env=NO_GPU)
    assert result.exit_code == 1
    assert "error: --checkpoint goes with a converted directory" in result.stderr


def test_a_missing_file_is_an_error_naming_it(ftx_cli: Any, gptj_checkpoint: Path, tmp_path: Path) -> None:
    directory = _converted(ftx_cli, gptj_checkpoint, tmp_path / "ft", 2)
    (directory / "model.layers.0.mlp.dense_h_to_4h.bias.1.bin").unlink()
    result = ftx_cli("verify", str(directory), env=NO_GPU)
    assert result.exit_code == 1
    assert "model.layers.0.mlp.dense_h_to_4h.bias.1.bin is missing" in result.stderr


def test_another_checkpoint_is_named_not_a_traceback(ftx_cli: Any, gptj_checkpoint: Path, tmp_path: Path) -> None:
    """--checkpoint pointing at a model of another vocabulary: a clear error before any forward pass."""
    from ftx_gptj.family import GPTJ

    other = build_tiny_checkpoint(
        GPTJ(), {**GPTJ_TINY, "vocab_size": 96}, tmp_path / "other", weight_std=TINY_WEIGHT_STD
    )
    directory = _converted(ftx_cli, gptj_checkpoint, tmp_path / "ft", 1)
    result = ftx_cli("verify", str(directory), "--checkpoint", str(other), env=NO_GPU)
    assert result.exit_code == 1 and result.exception is None
    assert "says vocab_size = 128" in result.stderr and "has 96" in result.stderr


def _poison(path: Path, rows: slice, width: int = 64) -> None:
    """Write NaN into ``rows`` of a float32 ``[rows, width]`` file."""
    table = np.fromfile(path, dtype=np.float32).reshape(-1, width)
    table[rows] = np.nan
    table.tofile(path)


def test_a_nan_in_an_embedding_row_no_prompt_reaches_fails(ftx_cli: Any, gptj_checkpoint: Path, tmp_path: Path) -> None:
    """The reference's prompt never reads row 127 of the embedding table: the logits alone would pass."""
    directory = _converted(ftx_cli, gptj_checkpoint, tmp_path / "ft", 1)
    _poison(directory / "model.wte.bin", slice(127, 128))
    result = ftx_cli("verify", str(directory), env=NO_GPU)
    assert result.exit_code == 1 and result.exception is None, result.stderr
    (line,) = result.stdout.splitlines()
    assert line.startswith("FAIL ") and "NaN or Inf values in 1 files: model.wte.bin (64)" in line
    assert "hold NaN or Inf weights" in result.stderr and "not the family's table" in result.stderr


def test_a_nan_in_lm_head_is_named_as_such_not_blamed_on_the_table(
    ftx_cli: Any, gptj_checkpoint: Path, tmp_path: Path
) -> None:
    directory = _converted(ftx_cli, gptj_checkpoint, tmp_path / "ft", 1)
    _poison(directory / "model.lm_head.weight.bin", slice(0, 1), width=128)
    result = ftx_cli("verify", str(directory), env=NO_GPU)
    assert result.exit_code == 1 and "model.lm_head.weight.bin" in result.stdout
    assert "hold NaN or Inf weights" in result.stderr and "puts a tensor where" not in result.stderr


@pytest.mark.parametrize("kind", ["latin-1", "device"])
def test_an_unreadable_config_ini_is_an_error_not_a_traceback(
    ftx_cli: Any, gptj_checkpoint: Path, tmp_path: Path, kind: str
) -> None:
    from cli_helpers import assert_clean_failure

    directory = _converted(ftx_cli, gptj_checkpoint, tmp_path / "ft", 1)
    ini = directory / "config.ini"
    if kind == "latin-1":
        ini.write_bytes(ini.read_bytes() + "; caf\xe9\n".encode("latin-1"))
        needle = "it is not UTF-8 text"
    else:
        ini.unlink()
        ini.symlink_to("/dev/zero")
        needle = "is a character device"
    assert_clean_failure(ftx_cli("verify", str(directory), env=NO_GPU), str(ini), needle)


def test_verify_without_torch_says_how_to_install_it(
    ftx_cli: Any, gptj_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain install has no torch (the kit extra brings it): an ImportError traceback once."""
    import sys

    from cli_helpers import assert_clean_failure

    directory = _converted(ftx_cli, gptj_checkpoint, tmp_path / "ft", 1)
    monkeypatch.setitem(sys.modules, "torch", None)  # what an environment without torch gives importlib
    result = ftx_cli("verify", str(directory), env=NO_GPU)
    assert_clean_failure(result, "needs torch", "download.pytorch.org/whl/cpu", "ftx-triton[kit]")
