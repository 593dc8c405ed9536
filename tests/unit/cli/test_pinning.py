"""Pinning: ftx.toml requirements checked before any stage, `ftx lock`, FTX_LOAD_PLUGINS, and cache
keys that follow the family table's fingerprint rather than version strings."""

from __future__ import annotations

import json
import os
import shutil
import tomllib
from pathlib import Path

import pytest


@pytest.fixture
def in_tmp_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_unmet_requirements_stop_before_any_stage(
    ftx_cli, ftx_home: Path, in_tmp_cwd: Path, tiny_gptj_dir: Path
) -> None:
    (in_tmp_cwd / "ftx.toml").write_text(
        'requires = ["ftx-triton>=0.1,<1", "ftx-triton-kogpt==9.9.9", "ftx-llama>=1"]\n'
    )
    result = ftx_cli("run", str(tiny_gptj_dir), "--until", "convert")
    assert result.exit_code == 1
    assert "ftx-triton-kogpt==9.9.9 (ftx-triton-kogpt 0.1.0 is installed)" in result.stderr
    assert "ftx-llama>=1 (not installed)" in result.stderr
    assert "ftx-triton>=0.1" not in result.stderr.split("requires", 1)[1].split("hint")[0]
    assert not (ftx_home / "store" / "fetch").exists()


def test_met_requirements_let_the_run_go(ftx_cli, in_tmp_cwd: Path, tiny_gptj_dir: Path) -> None:
    (in_tmp_cwd / "ftx.toml").write_text('requires = ["ftx-triton>=0.1,<1", "ftx-triton-gptj==0.1.0"]\n')
    result = ftx_cli("run", str(tiny_gptj_dir), "--until", "convert")
    assert result.exit_code == 0, result.stderr


def test_lock_pins_versions_and_source_then_run_uses_it(ftx_cli, in_tmp_cwd: Path, tiny_gptj_dir: Path) -> None:
    locked = ftx_cli("lock", str(tiny_gptj_dir))
    assert locked.exit_code == 0, locked.stderr
    data = tomllib.loads((in_tmp_cwd / "ftx.toml").read_text())
    assert data["requires"] == ["ftx-triton==0.1.0", "ftx-triton-gptj==0.1.0"]  # what the deployment uses, only
    assert data["model"]["source"] == os.path.relpath(tiny_gptj_dir, in_tmp_cwd)  # relative: the file is committed
    result = ftx_cli("run", "--until", "convert")  # MODEL comes from ftx.toml
    assert result.exit_code == 0, result.stderr
    assert Path(result.stdout.strip(), "config.ini").is_file()


def test_lock_into_a_directory_writes_ftx_toml_in_it(ftx_cli, in_tmp_cwd: Path, tiny_gptj_dir: Path) -> None:
    """`-o dir/` once wrote a file named `dir`."""
    from cli_helpers import assert_clean_failure

    (in_tmp_cwd / "deploy").mkdir()
    for given in ("deploy/", "deploy"):
        locked = ftx_cli("lock", str(tiny_gptj_dir), "-o", given)
        assert locked.exit_code == 0, locked.stderr
        assert locked.stdout.strip() == "deploy/ftx.toml" and (in_tmp_cwd / "deploy" / "ftx.toml").is_file()
    missing = ftx_cli("lock", str(tiny_gptj_dir), "-o", "nowhere/")
    assert_clean_failure(missing, "names a directory, which does not exist")
    assert not (in_tmp_cwd / "nowhere").exists()


def test_lock_does_not_overwrite_another_lock_silently(ftx_cli, in_tmp_cwd: Path, tiny_gptj_dir: Path) -> None:
    from cli_helpers import assert_clean_failure

    assert ftx_cli("lock", str(tiny_gptj_dir)).exit_code == 0
    first = (in_tmp_cwd / "ftx.toml").read_text()
    assert ftx_cli("lock", str(tiny_gptj_dir)).exit_code == 0  # the same pins again: nothing is lost
    refused = ftx_cli("lock", str(tiny_gptj_dir), "--tp", "2")
    assert_clean_failure(refused, "already exists and pins something else", "--force")
    assert (in_tmp_cwd / "ftx.toml").read_text() == first
    forced = ftx_cli("lock", str(tiny_gptj_dir), "--tp", "2", "--force")
    assert forced.exit_code == 0 and "tp = 2" in (in_tmp_cwd / "ftx.toml").read_text()


def test_load_plugins_allowlist(ftx_cli) -> None:
    result = ftx_cli("plugins", "--json", env={"FTX_LOAD_PLUGINS": "ftx-triton-gptj"})
    status = {r["name"]: r["status"] for r in json.loads(result.stdout)}
    assert status["gptj"] == "loaded"
    assert status["t5"] == status["gptneox"] == status["kogpt"] == "skipped"


def test_provenance_keys_follow_the_table_fingerprint(
    ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ftx_gptj.family import GPTJ
    from ftx_triton.conversion import ops
    from ftx_triton.conversion.tensormap import M, TensorMap

    first = ftx_cli("run", str(tiny_gptj_dir), "--until", "convert")
    assert first.exit_code == 0, first.stderr
    same = ftx_cli("run", str(tiny_gptj_dir), "--until", "convert")
    assert same.stdout == first.stdout  # unchanged table: the conversion is reused
    rows = [M(r.src, r.dst, r.op, r.split, r.shape, r.optional, r.invert) for r in GPTJ.tensors.rows]
    rows[-1] = M("lm_head.bias", "model.lm_head.bias", ops.identity, None, ("V",), optional=True)
    monkeypatch.setattr(GPTJ, "tensors", TensorMap(*rows))  # a plugin upgrade that changes a mapping
    changed = ftx_cli("run", str(tiny_gptj_dir), "--until", "convert")
    assert changed.exit_code == 0 and changed.stdout != first.stdout
    assert len(list((ftx_home / "store" / "convert").iterdir())) == 2


# --------------------------------------------------------------------------- ftx lock reproduces the deployment


def test_lock_records_settings_and_run_without_model_reproduces_them(
    ftx_cli, in_tmp_cwd: Path, tiny_gptj_dir: Path
) -> None:
    locked = ftx_cli(
        "lock",
        str(tiny_gptj_dir),
        "--tp",
        "2",
        "--weight-dtype",
        "fp16",
        "--runtime",
        "python",
        "--max-batch-size",
        "4",
    )
    assert locked.exit_code == 0, locked.stderr
    data = tomllib.loads((in_tmp_cwd / "ftx.toml").read_text())
    assert data["model"]["tree_sha256"] and data["model"]["fingerprint"].startswith("local-")
    settings = data["settings"]
    assert (settings["tp"], settings["weight_dtype"], settings["runtime"], settings["max_batch_size"]) == (
        2,
        "fp16",
        "python",
        4,
    )
    assert "data_type" not in settings  # not asked for: the replaying machine's runtime resolves it
    run = ftx_cli("run", "--until", "convert")
    assert run.exit_code == 0, run.stderr
    ft_dir = Path(run.stdout.strip())
    assert ft_dir.name == "2-gpu" and "weight_data_type = fp16" in (ft_dir / "config.ini").read_text()
    override = ftx_cli("run", "--until", "convert", "--tp", "1")  # the command line wins over the file
    assert override.exit_code == 0 and Path(override.stdout.strip()).name == "1-gpu"


def test_lock_of_a_changed_local_source_is_refused(
    ftx_cli, in_tmp_cwd: Path, tiny_gptj_dir: Path, tmp_path: Path
) -> None:
    import shutil

    src = tmp_path / 'we"ird dir'  # a quote in the path: TOML written by tomlkit stays valid
    shutil.copytree(tiny_gptj_dir, src)
    assert ftx_cli("lock", str(src)).exit_code == 0
    assert tomllib.loads((in_tmp_cwd / "ftx.toml").read_text())["model"]["source"] == os.path.relpath(src, in_tmp_cwd)
    assert ftx_cli("run", "--until", "fetch").exit_code == 0
    config = src / "config.json"
    config.write_text(config.read_text() + "\n")
    changed = ftx_cli("run", "--until", "fetch")
    assert changed.exit_code == 1 and "changed since `ftx lock`" in changed.stderr


def test_lock_of_the_builtin_demo_records_its_name_not_a_path(ftx_cli, in_tmp_cwd: Path, demo_ftx_home: Path) -> None:
    ftx_home = demo_ftx_home
    locked = ftx_cli("lock", "tiny-gptj")
    assert locked.exit_code == 0, locked.stderr
    text = (in_tmp_cwd / "ftx.toml").read_text()
    assert tomllib.loads(text)["model"]["source"] == "tiny-gptj"
    assert str(ftx_home) not in text and "/builtin/" not in text


def test_lock_of_a_url_records_its_sha256_and_the_download_is_not_kept(
    ftx_cli, ftx_home: Path, in_tmp_cwd: Path, tiny_gptj_dir: Path
) -> None:
    from fetch_helpers import LocalServer, checkpoint_entries, sha256, write_archive

    data = write_archive(in_tmp_cwd / "m.tar.zst", checkpoint_entries(tiny_gptj_dir)).read_bytes()
    with LocalServer() as server:
        server.serve_bytes("/m.tar.zst", data)
        locked = ftx_cli("lock", server.url("/m.tar.zst"))
        assert locked.exit_code == 0, locked.stderr
        assert tomllib.loads((in_tmp_cwd / "ftx.toml").read_text())["model"]["sha256"] == sha256(data)
        kept = [p for p in (ftx_home / "downloads").rglob("*") if p.is_file() and p.suffix != ".lock"]
        assert not kept, "the archive is removed once extracted"
        run = ftx_cli("run", "--until", "convert")
        assert run.exit_code == 0, run.stderr
        server.serve_bytes("/m.tar.zst", data[:-1] + b"x")  # the URL now serves other bytes
        tampered = ftx_cli("run", "--until", "fetch", "--force", "fetch")
        assert tampered.exit_code == 1 and "sha256" in tampered.stderr, "the pinned sha256 is checked"


# --------------------------------------------------------------------------- a lock replays on another kind of host


def _gpu_host_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in for a GPU host (none here): the Docker FasterTransformer runtime reports itself available, as
    it does with a daemon, the NVIDIA runtime and the image. Only planning (--dry-run) runs under it."""
    from ftx_triton.runtime.api import Availability
    from ftx_triton.runtime.fastertransformer.docker.plugin import DockerFasterTransformer

    monkeypatch.setattr(
        DockerFasterTransformer,
        "available",
        lambda self, settings, store=None: Availability(True, "stand-in GPU host: Docker, NVIDIA runtime, image"),
    )


def _plan(ftx_cli, *args: str, env: dict[str, str] | None = None) -> dict[str, str]:
    planned = ftx_cli("run", *args, "--dry-run", env=env)
    assert planned.exit_code == 0, planned.stderr
    lines = {line.split()[0]: line for line in planned.stdout.splitlines() if line and not line.startswith(" ")}
    return {"runtime": lines["runtime"].split()[1], "compute": lines["compute"].split()[1], "convert": lines["convert"]}


def test_a_lock_written_on_a_cpu_machine_replays_on_a_gpu_host_and_vice_versa(
    ftx_cli, in_tmp_cwd: Path, tiny_gptj_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock records what was asked (auto stays auto), not what this machine resolved: written here (no GPU) it
    plans the FasterTransformer runtime in fp16 on a GPU host; written on the GPU host it is the same file and plans
    the python runtime here. `ftx run --lock FILE` (and FTX_RUN_LOCK) reads a file written with `-o FILE`."""
    deploy = in_tmp_cwd / "deploy"
    deploy.mkdir()
    on_cpu = ftx_cli("lock", str(tiny_gptj_dir), "-o", "deploy/prod.toml")
    assert on_cpu.exit_code == 0, on_cpu.stderr
    written_on_cpu = (deploy / "prod.toml").read_text()
    settings = tomllib.loads(written_on_cpu)["settings"]
    assert (settings["runtime"], settings["weight_dtype"]) == ("auto", "auto") and "data_type" not in settings
    cpu_plan = _plan(ftx_cli, "--lock", "deploy/prod.toml")
    assert cpu_plan["runtime"] == "python" and cpu_plan["compute"] == "fp32"

    with monkeypatch.context() as gpu_host:
        _gpu_host_stand_in(gpu_host)
        gpu_plan = _plan(ftx_cli, env={"FTX_RUN_LOCK": "deploy/prod.toml"})
        assert gpu_plan["runtime"] == "fastertransformer-docker" and gpu_plan["compute"] == "fp16"
        (deploy / "prod.toml").unlink()
        on_gpu = ftx_cli("lock", str(tiny_gptj_dir), "-o", "deploy/prod.toml")
        assert on_gpu.exit_code == 0, on_gpu.stderr
    assert (deploy / "prod.toml").read_text() == written_on_cpu  # nothing of the machine that wrote it
    assert _plan(ftx_cli, "--lock", "deploy/prod.toml") == cpu_plan
    tokenizer = shutil.copytree(tiny_gptj_dir, in_tmp_cwd / "deploy" / "tokenizer")
    again = ftx_cli("lock", str(tiny_gptj_dir), "-o", "deploy/prod.toml", "--tokenizer", str(tokenizer))
    assert again.exit_code == 1 and "does not overwrite it silently" in again.stderr  # it says something else
    assert (deploy / "prod.toml").read_text() == written_on_cpu
    args = ("lock", str(tiny_gptj_dir), "-o", "deploy/prod.toml", "--tokenizer", str(tokenizer), "--force")
    assert ftx_cli(*args).exit_code == 0
    text = (deploy / "prod.toml").read_text()
    assert str(in_tmp_cwd) not in text  # nothing absolute in a file meant to be committed
    assert tomllib.loads(text)["settings"]["tokenizer"] == "tokenizer"
    elsewhere = in_tmp_cwd / "checkout"  # the file is committed and replayed from another directory
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert _plan(ftx_cli, "--lock", str(deploy / "prod.toml")) == cpu_plan


# --------------------------------------------------------------------------- a lock pins the stack


def test_lock_records_the_stack_and_a_replay_on_another_is_refused(
    ftx_cli, in_tmp_cwd: Path, tiny_gptj_dir: Path
) -> None:
    """The lock pins what computes and serves (torch, transformers, numpy, the tritonserver package, the image's
    and the native build's pinned sources); a replay where any of it differs is refused, --allow-drift goes on."""
    from importlib import metadata

    from cli_helpers import assert_clean_failure

    assert ftx_cli("lock", str(tiny_gptj_dir)).exit_code == 0
    stack = tomllib.loads((in_tmp_cwd / "ftx.toml").read_text())["stack"]
    assert stack["numpy"] == metadata.version("numpy") and stack["torch"] == metadata.version("torch")
    assert stack["transformers"] == metadata.version("transformers")
    assert stack["nvidia-pytriton"] == metadata.version("nvidia-pytriton")
    assert "FasterTransformer@df4a75348601" in stack["fastertransformer-docker"]
    assert stack["fastertransformer-native"].startswith("sources ")
    assert ftx_cli("run", "--until", "convert").exit_code == 0  # the same stack replays
    text = (in_tmp_cwd / "ftx.toml").read_text()
    (in_tmp_cwd / "ftx.toml").write_text(text.replace(f'numpy = "{stack["numpy"]}"', 'numpy = "1.0.0"'))
    refused = ftx_cli("run", "--until", "convert")
    assert_clean_failure(refused, "was locked on another stack", f"numpy 1.0.0 -> {stack['numpy']}", "--allow-drift")
    drifted = ftx_cli("run", "--until", "convert", "--allow-drift")
    assert drifted.exit_code == 0 and "locked on another stack" in drifted.stderr


def test_lock_resolve_records_what_this_machine_chooses(ftx_cli, in_tmp_cwd: Path, tiny_gptj_dir: Path) -> None:
    """Without a GPU, `auto` is the python runtime at tp 1 in fp32: --resolve writes those, not auto."""
    locked = ftx_cli("lock", str(tiny_gptj_dir), "--resolve")
    assert locked.exit_code == 0, locked.stderr
    settings = tomllib.loads((in_tmp_cwd / "ftx.toml").read_text())["settings"]
    assert (settings["runtime"], settings["tp"], settings["weight_dtype"]) == ("python", 1, "fp32")


def test_an_adapter_locked_by_an_earlier_ftx_still_replays_and_a_changed_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before chunked content keys, ``ftx lock`` recorded an adapter's revision from each file's plain sha256: such
    a lock still accepts the same files (it once said they had changed) and still refuses changed ones."""
    import hashlib

    from ftx_triton.cli.manifest import Manifest, locked_adapter
    from ftx_triton.errors import ConfigError

    monkeypatch.setenv("FTX_HOME", str(tmp_path / "home"))
    adapter = tmp_path / "project" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text('{"r": 4}')
    (adapter / "adapter_model.safetensors").write_bytes(b"a" * 3000)
    earlier = hashlib.sha256()  # the earlier definition, spelled out here
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        earlier.update(name.encode() + f"\0{hashlib.sha256((adapter / name).read_bytes()).hexdigest()}\n".encode())
    lock = tmp_path / "project" / "ftx.toml"
    manifest = Manifest(lock, model={"adapter": "adapter", "adapter_revision": f"content-{earlier.hexdigest()[:40]}"})
    assert locked_adapter(manifest) == str(adapter)
    (adapter / "adapter_config.json").write_text('{"r": 8}')
    with pytest.raises(ConfigError, match="changed since `ftx lock`"):
        locked_adapter(manifest)
