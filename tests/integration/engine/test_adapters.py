"""``--adapter``: a PEFT LoRA adapter merged into the weights before conversion (peft does the merge), cached
under the base's and the adapter's content, and every adapter a stranger could hand over refused before
anything is cached. The adapters are built here, offline, with peft on a tiny random GPT-J."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("peft")


def _make_adapter(base: Path, dest: Path, seed: int = 0) -> Path:
    """A rank-4 LoRA adapter on q_proj and v_proj with random (non-zero) lora_B, so the merge changes weights."""
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = transformers.GPTJForCausalLM.from_pretrained(base)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    peft_model.save_pretrained(dest)
    return dest


def _merged_state(base: Path, adapter: Path) -> dict[str, np.ndarray]:
    """What transformers + peft compute as the merged model (the reference)."""
    import transformers
    from peft import PeftModel

    model = transformers.GPTJForCausalLM.from_pretrained(base)
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    return {k: v.detach().float().numpy() for k, v in merged.state_dict().items()}


def _converted(stdout: str) -> dict[str, np.ndarray]:
    from ftx_gptj.family import GPTJ
    from ftx_triton.conversion.convert import invert_checkpoint

    return dict(invert_checkpoint(GPTJ(), Path(stdout.strip().splitlines()[-1])))


def _artifacts(ftx_cli) -> list[str]:
    result = ftx_cli("ls", "--json")
    assert result.exit_code == 0, result.stderr
    return sorted(row["stage"] for row in json.loads(result.stdout))


@pytest.fixture(scope="module")
def adapter_dir(tiny_gptj_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _make_adapter(tiny_gptj_dir, tmp_path_factory.mktemp("lora") / "adapter")


def test_the_adapter_is_merged_as_peft_merges_it_and_cached_under_its_content(
    ftx_cli, tiny_gptj_dir: Path, adapter_dir: Path, tmp_path: Path
) -> None:
    base = ftx_cli("run", str(tiny_gptj_dir), "--until", "convert", "--runtime", "python")
    assert base.exit_code == 0, base.stderr
    merged = ftx_cli(
        "run", str(tiny_gptj_dir), "--adapter", str(adapter_dir), "--until", "convert", "--runtime", "python"
    )
    assert merged.exit_code == 0, merged.stderr
    assert "adapt     done" in merged.stderr

    want = _merged_state(tiny_gptj_dir, adapter_dir)
    got, plain = _converted(merged.stdout), _converted(base.stdout)
    changed = "transformer.h.0.attn.q_proj.weight"
    assert not np.allclose(plain[changed], got[changed])  # the adapter changed the weights …
    for name, value in got.items():  # … exactly as peft merges them
        np.testing.assert_allclose(value, want[name], rtol=1e-5, atol=1e-6, err_msg=name)

    again = ftx_cli(
        "run", str(tiny_gptj_dir), "--adapter", str(adapter_dir), "--until", "convert", "--runtime", "python"
    )
    assert again.exit_code == 0, again.stderr
    assert "adapt     cached" in again.stderr and "convert   cached" in again.stderr

    other = _make_adapter(tiny_gptj_dir, tmp_path / "other", seed=1)  # other bytes: another merged checkpoint
    third = ftx_cli("run", str(tiny_gptj_dir), "--adapter", str(other), "--until", "convert", "--runtime", "python")
    assert third.exit_code == 0, third.stderr
    assert "adapt     done" in third.stderr and "convert   done" in third.stderr
    assert _artifacts(ftx_cli).count("adapt") == 2


def _pickled(adapter: Path, dest: Path) -> Path:
    shutil.copytree(adapter, dest)
    (dest / "adapter_model.safetensors").rename(dest / "adapter_model.bin")
    return dest


def _config_missing(adapter: Path, dest: Path) -> Path:
    shutil.copytree(adapter, dest)
    (dest / "adapter_config.json").unlink()
    return dest


def _link_out(adapter: Path, dest: Path) -> Path:
    outside = dest.parent / "elsewhere"
    shutil.copytree(adapter, outside)
    dest.mkdir()
    (dest / "adapter_config.json").symlink_to(outside / "adapter_config.json")
    shutil.copy(adapter / "adapter_model.safetensors", dest)
    return dest


def _other_size(adapter: Path, dest: Path) -> Path:
    from ftx_gptj.tiny import tiny_gptj

    bigger = tiny_gptj(dest.parent / "bigger-base", n_embd=96, n_head=4, tokenizer=False)
    return _make_adapter(bigger, dest)


def _other_model(adapter: Path, dest: Path) -> Path:
    shutil.copytree(adapter, dest)
    from safetensors.numpy import load_file, save_file

    tensors = load_file(dest / "adapter_model.safetensors")
    renamed = {k.replace("q_proj", "qkv_proj"): v for k, v in tensors.items()}
    save_file(renamed, dest / "adapter_model.safetensors")
    return dest


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (_pickled, "pickle"),
        (_config_missing, "no adapter_config.json"),
        (_link_out, "leads out of the adapter folder"),
        (_other_size, "trained for another size of model"),
        (_other_model, "does not have"),
    ],
    ids=["pickle", "no-config", "link-out-of-tree", "other-size", "other-model"],
)
def test_a_hostile_or_mismatched_adapter_is_refused_and_nothing_cached(
    ftx_cli, tiny_gptj_dir: Path, adapter_dir: Path, tmp_path: Path, make, needle: str
) -> None:
    bad = make(adapter_dir, tmp_path / "adapter")
    result = ftx_cli("run", str(tiny_gptj_dir), "--adapter", str(bad), "--until", "convert", "--runtime", "python")
    assert result.exit_code != 0
    assert "error:" in result.stderr and needle in result.stderr, result.stderr
    assert "hint:" in result.stderr
    assert "Traceback" not in result.stderr
    assert "adapt" not in _artifacts(ftx_cli) and "convert" not in _artifacts(ftx_cli)


def test_ftx_lock_pins_the_adapter_and_a_replay_refuses_a_changed_one(
    ftx_cli, tiny_gptj_dir: Path, adapter_dir: Path, tmp_path: Path
) -> None:
    import tomllib

    adapter = shutil.copytree(adapter_dir, tmp_path / "project" / "adapter")
    lock = tmp_path / "project" / "ftx.toml"
    locked = ftx_cli("lock", str(tiny_gptj_dir), "--adapter", str(adapter), "--runtime", "python", "-o", str(lock))
    assert locked.exit_code == 0, locked.stderr
    model = tomllib.loads(lock.read_text())["model"]
    assert model["adapter"] == "adapter" and model["adapter_revision"].startswith("content-")

    replay = ftx_cli("run", "--lock", str(lock), "--until", "convert")
    assert replay.exit_code == 0, replay.stderr
    assert "adapt     done" in replay.stderr

    (adapter / "adapter_config.json").write_text((adapter / "adapter_config.json").read_text() + "\n")
    changed = ftx_cli("run", "--lock", str(lock), "--until", "convert")
    assert changed.exit_code != 0
    assert "locked adapter" in changed.stderr and "changed since `ftx lock`" in changed.stderr
