"""A third-party family plugin written by `ftx plugin new` (from the template inside ftx) as
docs/writing-a-plugin.md describes, built out of tree and installed as a wheel into a fresh virtual
environment next to ftx: listed, converting, passing the conformance kit — with no change to core."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

SLUG = "mygpt"


def run(*args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def third_party_env(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("third-party")
    project = root / f"ftx-triton-{SLUG}"
    written = run(sys.executable, "-m", "ftx_triton", "plugin", "new", SLUG, "--dir", project, cwd=root)
    assert Path(written.stdout.strip()) == project and "model_type 'gpt2'" in written.stderr
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", root / "dist", project)
    (wheel,) = (root / "dist").glob(f"ftx_triton_{SLUG}-0.1.0-*.whl")
    env_dir = root / "env"
    run(sys.executable, "-m", "venv", "--without-pip", env_dir)
    python = env_dir / "bin" / "python"
    site_dir = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    # ftx and its dependencies come from the development environment, as if installed beside the plugin.
    (site_dir / "_ftx_base.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", wheel)
    return python, project


def test_listed_by_ftx_models_and_plugins(third_party_env: tuple[Path, Path], tmp_path: Path) -> None:
    python, _ = third_party_env
    env = {"FTX_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    models = {m["family"]: m for m in json.loads(run(python, "-m", "ftx_triton", "models", "--json", env=env).stdout)}
    assert models[SLUG]["distribution"] == f"ftx-triton-{SLUG}"
    assert {"gptj", SLUG} <= set(models)
    plugins = {r["name"]: r for r in json.loads(run(python, "-m", "ftx_triton", "plugins", "--json", env=env).stdout)}
    assert plugins[SLUG]["status"] == "loaded" and plugins[SLUG]["families"] == [SLUG]
    assert plugins[SLUG]["hooks"] == ["ftx_register_families"]


def test_converts_a_gpt2_checkpoint(third_party_env: tuple[Path, Path], tmp_path: Path) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    python, _ = third_party_env
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=128)
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    env = {"FTX_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    out = run(python, "-m", "ftx_triton", "convert", tmp_path / "gpt2", "--tp", "2", "--output", tmp_path / "ft", env=env)
    target = Path(out.stdout.strip())
    assert target == tmp_path / "ft" / "2-gpu"
    assert (target / "model.layers.1.attention.query_key_value.weight.1.bin").stat().st_size == 64 * 3 * 32 * 4
    assert "[gpt]" in (target / "config.ini").read_text()


def test_template_passes_the_conformance_kit(third_party_env: tuple[Path, Path], tmp_path: Path) -> None:
    python, project = third_party_env
    result = run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", project, project / "tests",
                 cwd=project, env={"FTX_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"})
    assert "9 passed" in result.stdout, result.stdout  # every test of the kit, generation through the python runtime included
