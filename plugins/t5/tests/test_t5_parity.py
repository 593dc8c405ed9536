"""T5 conversion against FasterTransformer's own converter (golden manifests): bytes and config.ini."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from ftx_t5.family import T5
from ftx_triton.conversion.convert import convert_checkpoint
from ftx_triton.conversion.dtypes import numpy_dtype
from ftx_triton.formats.checkpoint import open_checkpoint
from ftx_triton.formats.ftformat import read_ini, read_tensor
from ftx_triton.testing.golden import GoldenRun, load_runs, mismatches
from repo_paths import GOLDEN_DIR

CASES = ["t5-v1_0-tied", "t5-v1_1-tied"]
OMITTED = {"shared.weight.bin"}
"""Upstream writes it (the transposed embedding) but no FT loader reads it: golden README rule 2."""

GOLDEN_ROOT = GOLDEN_DIR
RUNS = [run for case in CASES for run in load_runs(GOLDEN_ROOT / case)]

REQUIRED = object()
DIMS = {
    key: (int, REQUIRED)
    for key in (
        "num_heads",
        "d_kv",
        "d_model",
        "d_ff",
        "num_layers",
        "vocab_size",
        "relative_attention_num_buckets_or_max_pos_seq_len",
    )
}
FT_READS: dict[str, dict[str, tuple[type, object]]] = {
    # what T5TritonModel and the T5 weight loaders read, with their defaults
    "encoder": {
        **DIMS,
        "_name_or_path": (str, REQUIRED),
        "feed_forward_proj": (str, REQUIRED),
        "weight_data_type": (str, REQUIRED),
        "adapter_inter_size": (int, 0),
        "adapter_norm_position": (str, "pre"),
        "num_tasks": (int, 0),
        "prompt_learning_type": (int, 0),
    },
    "decoder": {
        **DIMS,
        "weight_data_type": (str, REQUIRED),
        "decoder_start_token_id": (int, REQUIRED),
        "eos_token_id": (int, REQUIRED),
        "tie_word_embeddings": (bool, True),
        "adapter_inter_size": (int, 0),
        "adapter_norm_position": (str, "pre"),
    },
    "structure": {
        "t5_with_bias": (bool, False),
        "use_gated_activation": (bool, False),
        "position_embedding_type": (str, "relative"),
        "ia3_num_tasks": (int, 0),
    },
}
EXAMPLE_READS = {
    "encoder": {
        "num_decoder_layers": (int, REQUIRED),
        "pad_token_id": (int, REQUIRED),
        "eos_token_id": (int, REQUIRED),
        "is_gated_act": (bool, False),
        "relative_attention_max_distance": (int, REQUIRED),
    }
}
"""Keys FT's PyTorch T5 examples (configparser) read from [encoder]; ours keeps them too."""


def ft_value(section: dict[str, str], key: str, kind: type, default: object) -> object:
    """A value as FasterTransformer's INIReader returns it (Get / GetInteger / GetBoolean)."""
    text = section.get(key)
    if text is None:
        assert default is not REQUIRED, f"FT exits: no {key}"
        return default
    if kind is int:
        return int(text, 0)
    if kind is bool:
        value = text.strip().lower()
        return (
            True if value in {"true", "yes", "on", "1"} else False if value in {"false", "no", "off", "0"} else default
        )
    return text


def upstream_ini(run: GoldenRun, tmp_path: Path) -> dict[str, dict[str, str]]:
    path = tmp_path / "upstream-config.ini"
    path.write_text(run.config_ini)
    return read_ini(path)


def assert_ini_parity(ours_path: Path, run: GoldenRun, tmp_path: Path) -> None:
    ours, upstream = read_ini(ours_path), upstream_ini(run, tmp_path)
    for reads in (FT_READS, EXAMPLE_READS):
        for section, keys in reads.items():
            for key, (kind, default) in keys.items():
                assert ft_value(ours[section], key, kind, default) == ft_value(upstream[section], key, kind, default), (
                    f"[{section}] {key}"
                )


def assert_same_files(out_root: Path, run: GoldenRun) -> None:
    assert mismatches(out_root, run, may_omit=OMITTED) == []
    upstream = {rel.split("/", 1)[1] for rel in run.files if rel.endswith(".bin")}
    ours = {p.name for p in (out_root / f"{run.tp}-gpu").glob("*.bin")}
    assert ours == upstream - OMITTED


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.id)
def test_t5_matches_upstream_bytes_and_config(golden: Path, tmp_path: Path, run: GoldenRun) -> None:
    family = T5()
    source = golden / run.case / "hf"
    hf_config = family.read_hf_config(source)
    convert_checkpoint(
        family,
        open_checkpoint(source),
        hf_config,
        family.spec(hf_config),
        tmp_path / "out",
        tp=run.tp,
        weight_dtype=run.dtype,
    )
    assert_same_files(tmp_path / "out", run)
    assert_ini_parity(tmp_path / "out" / f"{run.tp}-gpu" / "config.ini", run, tmp_path)


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.id)
def test_t5_cli_convert_matches_upstream(golden: Path, tmp_path: Path, ftx_cli, run: GoldenRun) -> None:
    out = tmp_path / "out"
    result = ftx_cli(
        "convert",
        str(golden / run.case / "hf"),
        "--family",
        "t5",
        "--tp",
        str(run.tp),
        "--weight-dtype",
        run.dtype,
        "-o",
        str(out),
    )
    assert result.exit_code == 0, (result.stderr, result.exception)
    assert result.stdout.strip() == str(out / f"{run.tp}-gpu")
    assert_same_files(out, run)
    assert_ini_parity(out / f"{run.tp}-gpu" / "config.ini", run, tmp_path)


@pytest.mark.parametrize("case", CASES)
def test_t5_family_is_detected_without_flag(golden: Path, tmp_path: Path, ftx_cli, case: str) -> None:
    run = next(r for r in RUNS if r.case == case and r.tp == 2 and r.dtype == "fp16")
    result = ftx_cli(
        "convert", str(golden / case / "hf"), "--tp", "2", "--weight-dtype", "fp16", "-o", str(tmp_path / "out")
    )
    assert result.exit_code == 0, (result.stderr, result.exception)
    assert_same_files(tmp_path / "out", run)


@pytest.mark.parametrize("run", [r for r in RUNS if r.tp == 1], ids=lambda r: r.id)
def test_omitted_shared_weight_bin_is_only_a_transposed_copy(golden: Path, tmp_path: Path, run: GoldenRun) -> None:
    """Upstream's shared.weight.bin is shared.weight_T.bin transposed; the loaders read only the latter."""
    family = T5()
    source = golden / run.case / "hf"
    hf_config = family.read_hf_config(source)
    spec = family.spec(hf_config)
    convert_checkpoint(family, open_checkpoint(source), hf_config, spec, tmp_path, tp=1, weight_dtype=run.dtype)
    d = spec.dims
    table = read_tensor(tmp_path / "1-gpu" / "shared.weight_T.bin", numpy_dtype(run.dtype), (d["V"], d["H"]))
    transposed = np.ascontiguousarray(table.T).tobytes()
    assert hashlib.sha256(transposed).hexdigest() == run.files["1-gpu/shared.weight.bin"]["sha256"]


@pytest.mark.parametrize("case", CASES)
def test_upstream_config_ini_rebuilds_the_same_spec(golden: Path, tmp_path: Path, case: str) -> None:
    """A directory converted by upstream can be described (python runtime, invert) from its config.ini."""
    family = T5()
    run = next(r for r in RUNS if r.case == case)
    ours = family.spec(family.read_hf_config(golden / case / "hf"))
    theirs = family.spec_from_ini(upstream_ini(run, tmp_path))
    assert (theirs.dims, theirs.layers, theirs.start_id, theirs.end_id, theirs.pad_id) == (
        ours.dims,
        ours.layers,
        ours.start_id,
        ours.end_id,
        ours.pad_id,
    )
    assert theirs.extra["gated"] == ours.extra["gated"] and theirs.extra["tie_word_embeddings"] is True
