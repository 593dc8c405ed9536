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


def run(
    *args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
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


def test_the_wheel_declares_a_test_extra_pulling_the_kit(third_party_env: tuple[Path, Path]) -> None:
    """`pip install 'ftx-triton-mygpt[test]'` brings core's kit extra (pytest, torch, transformers)."""
    import zipfile
    from email.parser import Parser

    from packaging.requirements import Requirement

    _, project = third_party_env
    (wheel,) = (project.parent / "dist").glob(f"ftx_triton_{SLUG}-0.1.0-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        metadata = Parser().parsestr(archive.read(f"ftx_triton_{SLUG}-0.1.0.dist-info/METADATA").decode())
    assert "test" in metadata.get_all("Provides-Extra", [])
    kit = [r for r in map(Requirement, metadata.get_all("Requires-Dist", [])) if r.extras == {"kit"}]
    assert [r.name for r in kit] == ["ftx-triton"]
    assert kit and kit[0].marker is not None and kit[0].marker.evaluate({"extra": "test"})
    assert not kit[0].marker.evaluate({"extra": ""})


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
    out = run(
        python, "-m", "ftx_triton", "convert", tmp_path / "gpt2", "--tp", "2", "--output", tmp_path / "ft", env=env
    )
    target = Path(out.stdout.strip())
    assert target == tmp_path / "ft" / "2-gpu"
    assert (target / "model.layers.1.attention.query_key_value.weight.1.bin").stat().st_size == 64 * 3 * 32 * 4
    assert "[gpt]" in (target / "config.ini").read_text()


def test_template_passes_the_conformance_kit(third_party_env: tuple[Path, Path], tmp_path: Path) -> None:
    python, project = third_party_env
    result = run(
        python,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        project,
        project / "tests",
        cwd=project,
        env={"FTX_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"},
    )
    assert "10 passed" in result.stdout, result.stdout  # every test of the kit (python runtime and FT reference too)


def test_a_published_plugin_installs_from_a_local_index_next_to_core(tmp_path: Path) -> None:
    """Published as a wheel into a local index (a directory of wheels) beside core's own wheel, the plugin
    installs with `pip install --no-index --find-links INDEX ftx-triton-SLUG`: its requirement `ftx-triton`
    resolves to core by its new name, from the index (never to another project's `ftx`). Core's third-party
    dependencies (numpy, torch, transformers …) come from the development environment, offered to the fresh
    environment as an extra site directory without any ftx distribution in it."""
    index, base = tmp_path / "index", tmp_path / "base-site"
    base.mkdir()
    project = tmp_path / f"ftx-triton-{SLUG}"
    run(sys.executable, "-m", "ftx_triton", "plugin", "new", SLUG, "--dir", project, cwd=tmp_path)
    core = Path(__file__).resolve().parents[3] / "core"
    for source in (project, core):
        run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", index, source)
    assert sorted(w.name.split("-")[0] for w in index.glob("*.whl")) == ["ftx_triton", f"ftx_triton_{SLUG}"]
    dev_site = Path(sysconfig.get_paths()["purelib"])
    for entry in dev_site.iterdir():  # everything but ftx's own distributions (editable installs of this tree)
        if not entry.name.lower().startswith(("ftx", "_editable_impl_ftx", "__editable__.ftx")):
            (base / entry.name).symlink_to(entry)
    env_dir = tmp_path / "env"
    run(sys.executable, "-m", "venv", "--without-pip", env_dir)
    python = env_dir / "bin" / "python"
    site_dir = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    (site_dir / "_base.pth").write_text(f"import site; site.addsitedir({str(base)!r})\n")
    installed = run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "--no-index",
        "--find-links",
        index,
        f"ftx-triton-{SLUG}",
    )
    assert "Successfully installed" in installed.stdout and "ftx-triton-0.1.0" in installed.stdout, installed.stdout
    where = run(python, "-c", "import ftx_triton; print(ftx_triton.__file__)").stdout.strip()
    assert Path(where).is_relative_to(site_dir)  # core from the index's wheel, not this checkout
    env = {"FTX_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    plugins = {r["name"]: r for r in json.loads(run(env_dir / "bin" / "ftx", "plugins", "--json", env=env).stdout)}
    assert plugins[SLUG]["status"] == "loaded" and plugins[SLUG]["distribution"] == f"ftx-triton-{SLUG}"
