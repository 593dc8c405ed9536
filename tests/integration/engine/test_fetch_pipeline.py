"""Fetching through the whole pipeline (`ftx pull`, `ftx run --until convert`): URL archives and
hf:// sources, against servers on 127.0.0.1 (a fake Hub stands in for huggingface.co)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fetch_helpers import BytesRoute, Entry, LocalServer, checkpoint_entries, sha256, write_archive
from hub_fake import DEV, MAIN, REPO, FakeHub


@pytest.fixture
def archive_server(tiny_gptj_dir: Path, tmp_path: Path):
    archive = write_archive(tmp_path / "tiny-gptj.tar.zst", checkpoint_entries(tiny_gptj_dir))
    data = archive.read_bytes()
    with LocalServer() as server:
        route = BytesRoute(data, chunk_delay_s=0.002)
        server.route("/models/tiny-gptj.tar.zst", route)
        server.route_obj = route  # type: ignore[attr-defined]
        server.archive_sha = sha256(data)  # type: ignore[attr-defined]
        yield server


def test_pull_and_run_from_an_archive_url(ftx_cli, archive_server) -> None:
    url = archive_server.url("/models/tiny-gptj.tar.zst")
    sha = archive_server.archive_sha
    pulled = ftx_cli("pull", url, "--sha256", sha)
    assert pulled.exit_code == 0, pulled.stderr
    root = Path(pulled.stdout.strip())
    assert (root / "config.json").is_file() and (root / "model.safetensors").is_file()
    converted = ftx_cli("--log-format", "json", "run", url, "--sha256", sha, "--until", "convert")
    assert converted.exit_code == 0, converted.stderr
    assert '"event": "cache.hit"' in converted.stderr and '"stage": "fetch"' in converted.stderr
    assert Path(converted.stdout.strip(), "config.ini").is_file()
    assert archive_server.route_obj.gets == 1  # the second command downloaded nothing


def test_checksum_mismatch_fails_and_publishes_nothing(ftx_cli, ftx_home: Path, archive_server) -> None:
    url = archive_server.url("/models/tiny-gptj.tar.zst")
    result = ftx_cli("pull", url, "--sha256", "0" * 64)
    assert result.exit_code == 1 and "sha256" in result.stderr.lower()
    fetched = ftx_home / "store" / "fetch"
    assert not fetched.exists() or not any(fetched.iterdir())


def test_concurrent_pulls_download_once(ftx_home: Path, archive_server) -> None:
    url = archive_server.url("/models/tiny-gptj.tar.zst")
    env = {**os.environ, "FTX_HOME": str(ftx_home)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "ftx_triton", "pull", url, "--sha256", archive_server.archive_sha],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert outputs[0][0] == outputs[1][0]
    full_gets = [r for r in archive_server.requests if r.method == "GET" and "Range" not in r.headers]
    assert len(full_gets) == 1


@pytest.fixture
def hub_with_model(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_gptj_dir: Path):
    files = {p.name: p.read_bytes() for p in tiny_gptj_dir.iterdir() if p.is_file()}
    files |= {"pytorch_model.bin": b"never fetched", "flax_model.msgpack": b"never fetched", "README.md": b"x"}
    other = dict(files, **{"config.json": files["config.json"]})
    fake = FakeHub(files={MAIN: files, DEV: other})
    with LocalServer() as server:
        server.fallback = fake
        for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HF_ENDPOINT", server.base_url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
        yield server


def test_hf_source_is_pinned_filtered_and_converted(ftx_cli, ftx_home: Path, hub_with_model) -> None:
    result = ftx_cli("--log-format", "json", "run", f"hf://{REPO}@dev", "--until", "convert")
    assert result.exit_code == 0, result.stderr
    requested = {
        r.path.split("/resolve/", 1)[1].split("/", 1)[1] for r in hub_with_model.requests if "/resolve/" in r.path
    }
    assert "model.safetensors" in requested and "tokenizer.json" in requested
    assert not requested & {"pytorch_model.bin", "flax_model.msgpack", "README.md"}
    assert all(f"/resolve/{DEV}/" in r.path for r in hub_with_model.requests if "/resolve/" in r.path)
    (fetch_dir,) = (ftx_home / "store" / "fetch").iterdir()
    meta = json.loads((fetch_dir / "ftx-artifact.json").read_text())
    assert meta["inputs"]["revision"] == DEV
    assert meta["result"]["origin"] == {"kind": "hf", "repo": REPO, "commit": DEV}


def test_refused_download_leaves_nothing_in_downloads(ftx_cli, ftx_home: Path, tmp_path: Path) -> None:
    """Issue 27: a downloaded archive ftx refuses (here: a member with an escape sequence) stayed in
    downloads/ for a week with its .lock file; now both go with the refusal."""
    archive = write_archive(tmp_path / "bad.tar.gz", [Entry("m/\x1b[31mconfig.json", b"{}")])
    with LocalServer() as server:
        server.serve_bytes("/bad.tar.gz", archive.read_bytes())
        result = ftx_cli("pull", server.url("/bad.tar.gz"))
    assert result.exit_code == 1 and "control or bidi-override" in result.stderr, result.stderr
    assert "\x1b" not in result.stderr
    downloads = ftx_home / "downloads"
    assert not downloads.exists() or [p for p in downloads.rglob("*") if not p.is_dir()] == []


@pytest.mark.parametrize("path", ["/models/..", "/models/x.bin"])
def test_url_naming_no_archive_is_refused_before_downloading(ftx_cli, ftx_home: Path, path: str) -> None:
    """Issue 27: these were downloaded whole (or crashed with a traceback) before being refused."""
    with LocalServer() as server:
        server.serve_bytes(path, b"x" * 1000)
        result = ftx_cli("pull", server.base_url + path)
        assert not server.seen("GET") and not server.seen("HEAD")
    assert result.exit_code != 0 and "Traceback" not in result.stderr
    assert "error:" in result.stderr and "hint:" in result.stderr
    assert not (ftx_home / "downloads").exists() or not any((ftx_home / "downloads").rglob("*"))
