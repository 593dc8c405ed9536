"""Safe defaults: sizes estimated before fetching and refused when they do not fit (with the flag
that overrides), the source's dtype kept, licences shown and accepted explicitly, hints that are
true (did-you-mean, missing paths, who chose the runtime)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from ftx_gptj.tiny import tiny_gptj


def _huge_config_dir(path: Path) -> Path:
    """A checkpoint directory with only config.json, claiming a GPT-J of about 1.2 T parameters."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "gptj",
                "architectures": ["GPTJForCausalLM"],
                "n_embd": 32768,
                "n_head": 64,
                "n_layer": 96,
                "rotary_dim": 64,
                "vocab_size": 50400,
                "n_positions": 2048,
                "torch_dtype": "float16",
                "tie_word_embeddings": False,
            }
        )
    )
    return path


def test_dry_run_says_sizes_memory_and_compute_type(ftx_cli) -> None:
    result = ftx_cli("run", "gptj", "--dry-run", "--runtime", "python")
    assert result.exit_code == 0, result.stderr
    err = result.stdout  # the plan is the dry run's result
    assert "6.05 B parameters; source stored as fp32" in err
    assert "download 24.2 GB, converted 24.2 GB (fp32)" in err and "free at" in err
    assert "python runtime needs about" in err and "available" in err
    assert "compute   fp32 (the weight dtype)" in err


def test_dry_run_and_help_agree_on_the_fastertransformer_compute_type(ftx_cli) -> None:
    dry = ftx_cli("run", "kogpt", "--dry-run", "--runtime", "fastertransformer")
    assert dry.exit_code == 0, dry.stderr
    assert "convert   kogpt" in dry.stdout and "(fp16, tp=1)" in dry.stdout  # the preset's fp16 is kept
    assert "compute   fp16 (the fastertransformer-docker runtime's default)" in dry.stdout
    assert "download 12.3 GB, converted 12.3 GB (fp16)" in dry.stdout
    help_text = " ".join(ftx_cli("run", "--help").stdout.split())
    assert "fp16 on the fastertransformer runtime" in help_text
    assert "auto = the source's own" in help_text


def test_fastertransformer_plans_weights_in_the_compute_type(ftx_cli) -> None:
    """An fp32 hub checkpoint served in fp16 on FasterTransformer converts to fp16 files (half the bytes);
    --weight-dtype and --data-type still choose."""
    dry = ftx_cli("run", "gptj", "--tp", "4", "--runtime", "fastertransformer", "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    assert "source stored as fp32" in dry.stdout
    assert "converted 12.1 GB (fp16)" in dry.stdout and "(fp16, tp=4)" in dry.stdout
    assert "--weight-dtype fp16" in dry.stdout
    kept = ftx_cli("run", "gptj", "--tp", "4", "--runtime", "fastertransformer", "--dry-run", "--weight-dtype", "fp32")
    assert "converted 24.2 GB (fp32)" in kept.stdout and "--weight-dtype fp32" in kept.stdout
    bf16 = ftx_cli("run", "gptj", "--runtime", "fastertransformer", "--dry-run", "--data-type", "bf16")
    assert "converted 12.1 GB (bf16)" in bf16.stdout


def test_an_fp32_source_converts_to_the_compute_type_for_fastertransformer(
    ftx_cli, ftx_home: Path, tmp_path: Path
) -> None:
    """A real conversion through `ftx run` (stopped after convert: no FasterTransformer binary here)."""
    src = tiny_gptj(tmp_path / "src")  # fp32
    result = ftx_cli("run", str(src), "--runtime", "fastertransformer", "--until", "convert")
    assert result.exit_code == 0, result.stderr
    inis = list((ftx_home / "store" / "convert").rglob("config.ini"))
    assert len(inis) == 1 and "weight_data_type = fp16" in inis[0].read_text()
    python = ftx_cli("run", str(src), "--runtime", "python", "--until", "convert")
    assert python.exit_code == 0, python.stderr
    inis = list((ftx_home / "store" / "convert").rglob("config.ini"))
    assert sorted("weight_data_type = fp32" in ini.read_text() for ini in inis) == [False, True]


def test_serving_more_than_the_memory_is_refused_before_anything_is_fetched(
    ftx_cli, ftx_home: Path, tmp_path: Path
) -> None:
    src = _huge_config_dir(tmp_path / "huge")
    result = ftx_cli("run", str(src), "--runtime", "python")
    assert result.exit_code == 1
    assert "would not fit on this machine: memory: the python runtime needs about" in result.stderr
    assert "--no-resource-check" in result.stderr
    assert not (ftx_home / "store" / "fetch").exists() or not any((ftx_home / "store" / "fetch").iterdir())
    # the override lets the run go on (it then stops where a config-only checkpoint must: no weights)
    forced = ftx_cli("run", str(src), "--runtime", "python", "--no-resource-check", "--until", "fetch")
    assert forced.exit_code == 0, forced.stderr


@pytest.fixture
def small_disk(tmp_path: Path):
    """A real 4 MiB filesystem (tmpfs) as FTX_HOME; skipped where mounting is not allowed."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_conversion_larger_than_the_free_disk_is_refused_before_writing(
    ftx_cli, small_disk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tiny_gptj(tmp_path / "src", n_layer=4, n_embd=256, n_head=4, vocab_size=1024)  # ~3.7 M params, fp32
    monkeypatch.setenv("FTX_HOME", str(small_disk))
    result = ftx_cli("run", str(src), "--until", "convert")
    assert result.exit_code == 1, result.stderr
    assert "needs would not fit on this machine: disk:" in result.stderr and "free" in result.stderr
    assert "--no-resource-check" in result.stderr
    assert not list((small_disk / "store").rglob("*.bin")), "nothing was written"
    # fp16 halves it, still more than 4 MiB: refused too
    assert ftx_cli("run", str(src), "--until", "convert", "--weight-dtype", "fp16").exit_code == 1


@pytest.mark.parametrize("declared", [True, False], ids=["config-torch_dtype", "safetensors-header"])
def test_weight_dtype_defaults_to_the_sources(ftx_cli, tmp_path: Path, declared: bool) -> None:
    src = tiny_gptj(tmp_path / "src", dtype="float16")
    if not declared:
        config = json.loads((src / "config.json").read_text())
        config.pop("torch_dtype", None)
        config.pop("dtype", None)
        (src / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out"
    result = ftx_cli("convert", str(src), "-o", str(out))
    assert result.exit_code == 0, result.stderr
    ini = (out / "1-gpu" / "config.ini").read_text()
    assert "weight_data_type = fp16" in ini
    assert json.loads((out / "1-gpu" / "ftx-convert.json").read_text())["weight_dtype"] == "fp16"
    explicit = ftx_cli("convert", str(src), "-o", str(tmp_path / "out32"), "--weight-dtype", "fp32")
    assert explicit.exit_code == 0
    assert "weight_data_type = fp32" in (tmp_path / "out32" / "1-gpu" / "config.ini").read_text()


def test_noncommercial_licence_is_shown_and_needs_acceptance(ftx_cli, ftx_home: Path) -> None:
    refused = ftx_cli("pull", "kogpt")
    assert refused.exit_code == 1
    assert "licence   kogpt is licensed CC-BY-NC-ND-4.0 (non-commercial use only" in refused.stderr
    assert "--accept-license" in refused.stderr and "FTX_ACCEPT_LICENSE" in refused.stderr
    assert not (ftx_home / "store" / "fetch").exists() or not any((ftx_home / "store" / "fetch").iterdir())
    dry = ftx_cli("run", "kogpt", "--dry-run")
    assert dry.exit_code == 0 and "CC-BY-NC-ND-4.0" in dry.stdout


def test_licence_rule_is_cores() -> None:
    from ftx_triton.errors import LicenseError
    from ftx_triton.fetching.licenses import check, is_noncommercial

    assert is_noncommercial("CC-BY-NC-ND-4.0") and is_noncommercial("cc-by-nc-4.0")
    assert not is_noncommercial("apache-2.0") and not is_noncommercial("CC-BY-4.0") and not is_noncommercial(None)
    with pytest.raises(LicenseError):
        check("x", "CC-BY-NC-4.0", accepted=False)
    check("x", "CC-BY-NC-4.0", accepted=True)
    check("x", "mit", accepted=False)


def test_preset_typo_gets_did_you_mean_and_a_missing_path_is_called_one(ftx_cli, tmp_path: Path) -> None:
    typo = ftx_cli("run", "gtpj", "--dry-run")
    assert typo.exit_code == 1 and "did you mean gptj?" in typo.stderr
    missing = ftx_cli("run", "./missing-dir", "--dry-run")
    assert missing.exit_code == 1
    assert "'./missing-dir' does not exist" in missing.stderr and "hf://" not in missing.stderr


def test_a_commands_default_runtime_is_not_called_a_flag(tmp_path: Path) -> None:
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.plugins import load_host
    from ftx_triton.runtime.select import choose_runtime
    from ftx_triton.store.artifact_store import ArtifactStore

    runtimes, store = load_host().runtimes, ArtifactStore(tmp_path)
    _, why = choose_runtime(
        runtimes, RunSettings.of("m", runtime="python", runtime_origin="ftx configure's default"), store
    )
    assert why == "python from ftx configure's default"
    _, why = choose_runtime(runtimes, RunSettings.of("m", runtime="python"), store)
    assert why == "requested with --runtime python"
