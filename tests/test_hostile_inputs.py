"""Hostile input and faults: each bad input or fault of issue #14 that ftx now handles cleanly.

Every case is a real input through the real code (the CLI in-process via click's CliRunner,
or the store on a real FTX_HOME); each failed before its fix. Bad input ends in exit 1 with
``error:`` and ``hint:`` lines, no traceback, and nothing half-written that a later run trusts.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from ftx.store import PROVENANCE_FILE, ArtifactStore
from test_pipeline import events, run_until_configure

# --- the store: content, provenance, publishing ----------------------------------------------


def build_three_files(store: ArtifactStore, key: str = "k", *, force: bool = False, tag: bytes = b"v1"):
    def builder(tmp: Path) -> dict:
        (tmp / "1-gpu").mkdir()
        (tmp / "1-gpu" / "model.wte.bin").write_bytes(tag * 1000)
        (tmp / "1-gpu" / "config.ini").write_text("[gptj]\n")
        (tmp / "preprocessing" / "1").mkdir(parents=True)
        (tmp / "preprocessing" / "1" / "model.py").write_text("print('ok')\n")
        return {"result": {"tag": tag.decode()}}

    return store.build("convert", key, builder, inputs={}, producer={}, force=force)


def flip_same_size(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    path.write_bytes(bytes(data))


def keep_times(path: Path, edit: Callable[[Path], None]) -> None:
    """Edit ``path`` and put its mtime back (ctime still moves: the kernel sets it)."""
    st = path.stat()
    edit(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def rewrite_meta(edit: Callable[[dict], object]) -> Callable[[Path], None]:
    def apply(art: Path) -> None:
        meta = json.loads((art / PROVENANCE_FILE).read_text())
        replaced = edit(meta)
        (art / PROVENANCE_FILE).write_text(json.dumps(meta if replaced is None else replaced))

    return apply


def to_symlink(path: Path) -> None:
    data = path.read_bytes()
    path.unlink()
    (path.parent / "elsewhere.bin").write_bytes(data)
    path.symlink_to("elsewhere.bin")


TAMPERINGS: dict[str, Callable[[Path], None]] = {
    "bin-same-size-edit": lambda a: flip_same_size(a / "1-gpu" / "model.wte.bin"),
    "bin-same-size-edit-mtime-restored": lambda a: keep_times(a / "1-gpu" / "model.wte.bin", flip_same_size),
    "model.py-edited": lambda a: (a / "preprocessing" / "1" / "model.py").write_text("import os; os.system('x')\n"),
    "model.py-same-size": lambda a: flip_same_size(a / "preprocessing" / "1" / "model.py"),
    "file-removed": lambda a: (a / "1-gpu" / "config.ini").unlink(),
    "file-added": lambda a: (a / "1-gpu" / "extra.py").write_text("evil"),
    "file-became-symlink": lambda a: to_symlink(a / "1-gpu" / "model.wte.bin"),
    "provenance-not-json": lambda a: (a / PROVENANCE_FILE).write_text("{not json"),
    "provenance-binary": lambda a: (a / PROVENANCE_FILE).write_bytes(b"\xff\xfe\x00garbage"),
    "provenance-a-list": rewrite_meta(lambda m: [m]),
    "provenance-a-directory": lambda a: ((a / PROVENANCE_FILE).unlink(), (a / PROVENANCE_FILE).mkdir()),
    "outputs-empty": rewrite_meta(lambda m: m.update(outputs={})),
    "outputs-missing": rewrite_meta(lambda m: m.pop("outputs")),
    "outputs-a-list": rewrite_meta(lambda m: m.update(outputs=list(m["outputs"]))),
    "output-without-sha256": rewrite_meta(lambda m: [o.pop("sha256") for o in m["outputs"].values()]),
    "output-size-a-string": rewrite_meta(lambda m: [o.update(size="x") for o in m["outputs"].values()]),
    "provenance-of-another-key": rewrite_meta(lambda m: m.update(key="other")),
}


@pytest.mark.parametrize("case", sorted(TAMPERINGS))
def test_tampered_artifact_is_rebuilt_not_trusted(ftx_home: Path, case: str) -> None:
    store = ArtifactStore(ftx_home)
    art, cached = build_three_files(store)
    assert not cached and build_three_files(store)[1]  # intact: a cache hit
    TAMPERINGS[case](art.path)
    assert store.lookup("convert", "k") is None
    again, cached = build_three_files(store)  # no traceback, no "delete it by hand"
    assert not cached and again.path == art.path
    assert (art.path / "1-gpu" / "model.wte.bin").read_bytes() == b"v1" * 1000
    assert not (art.path / "1-gpu" / "extra.py").exists()
    assert build_three_files(store)[1]


def test_rehash_after_a_harmless_touch_then_the_fast_path_again(ftx_home: Path, log_events: list) -> None:
    store = ArtifactStore(ftx_home)
    art, _ = build_three_files(store)
    os.utime(art.path / "1-gpu" / "model.wte.bin")  # new mtime, same bytes
    assert store.lookup("convert", "k") is not None
    assert [e["files"] for e in log_events if e["event"] == "cache.rehashed"] == [1]
    assert store.lookup("convert", "k") is not None  # the refreshed stat record: no second re-hash
    assert len([e for e in log_events if e["event"] == "cache.rehashed"]) == 1


def test_every_stage_hashes_its_outputs_convert_included(ftx_cli, ftx_home: Path, tiny_gptj_dir: Path) -> None:
    run_until_configure(ftx_cli, tiny_gptj_dir)
    for meta_path in (ftx_home / "store").glob(f"*/*/{PROVENANCE_FILE}"):
        outputs = json.loads(meta_path.read_text())["outputs"]
        assert all(len(o["sha256"]) == 64 for o in outputs.values()), meta_path


@pytest.mark.parametrize(
    ("stage", "rel"),
    [("convert", "1-gpu/model.wte.bin"), ("configure", "preprocessing/1/model.py")],
)
def test_same_size_edit_in_the_store_is_caught_by_the_cli(ftx_cli, ftx_home: Path, tiny_gptj_dir: Path,
                                                          stage: str, rel: str) -> None:
    run_until_configure(ftx_cli, tiny_gptj_dir)
    (art,) = (ftx_home / "store" / stage).iterdir()
    original = (art / rel).read_bytes()
    flip_same_size(art / rel)
    again = run_until_configure(ftx_cli, tiny_gptj_dir)
    evs = events(again.stderr)
    assert any(e["event"] == "cache.corrupt" and e["stage"] == stage for e in evs)
    assert stage in [e["stage"] for e in evs if e["event"] == "stage.finished"]
    assert (art / rel).read_bytes() == original


def test_unreadable_provenance_does_not_stop_runs(ftx_cli, ftx_home: Path, tiny_gptj_dir: Path) -> None:
    run_until_configure(ftx_cli, tiny_gptj_dir)
    for meta_path in (ftx_home / "store").glob(f"*/*/{PROVENANCE_FILE}"):
        meta_path.write_text("[1, 2")
    again = run_until_configure(ftx_cli, tiny_gptj_dir)
    assert [e["stage"] for e in events(again.stderr) if e["event"] == "stage.finished"] == [
        "fetch", "convert", "tune", "configure"]


KILL_BETWEEN_RENAMES = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from ftx.store import ArtifactStore
    real_replace = os.replace
    def replace(src, dst):
        real_replace(src, dst)
        if ".old-" in str(dst):  # the old artifact is aside, the new one not yet in place
            os.kill(os.getpid(), signal.SIGKILL)
    os.replace = replace
    def builder(tmp):
        (tmp / "w.bin").write_bytes(b"new")
        return {}
    ArtifactStore(Path(sys.argv[1])).build("convert", "k", builder, inputs={}, producer={}, force=True)
""")


def test_kill_between_the_renames_of_a_forced_publish_loses_nothing(ftx_home: Path) -> None:
    """A real SIGKILL, sent by the process to itself at the worst moment of a --force publish."""
    store = ArtifactStore(ftx_home)
    art, _ = build_three_files(store)
    proc = subprocess.run([sys.executable, "-c", KILL_BETWEEN_RENAMES, str(ftx_home)], check=False,
                          capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not art.path.exists()  # the window the kill landed in
    hit, cached = build_three_files(store, tag=b"v2")
    assert cached and (hit.path / "1-gpu" / "model.wte.bin").read_bytes() == b"v1" * 1000
    leftovers = [p.name for p in [*(ftx_home / "store" / "convert").iterdir(), *store.tmp_root.iterdir()]]
    assert leftovers == ["k"]


def test_stale_build_and_old_directories_are_removed_under_the_lock(ftx_home: Path) -> None:
    store = ArtifactStore(ftx_home)
    art, _ = build_three_files(store)
    stale = [store.tmp_root / "convert-k-999-deadbeef", store.tmp_root / "old-k-deadbeef",
             art.path.parent / ".k.old-deadbeef", art.path.parent / ".k.tmp-deadbeef"]
    for path in stale:
        path.mkdir()
        (path / "w.bin").write_bytes(b"x")
    build_three_files(store, force=True, tag=b"v2")
    assert [p for p in stale if p.exists()] == []
    assert (art.path / "1-gpu" / "model.wte.bin").read_bytes() == b"v2" * 1000


# --- secrets: presigned URLs and tokens are stored nowhere, servers get no token ---------------

SIGNATURE = "SIGsecret0123456789abcdef"
HF_SECRET = "hf_" + "Q" * 34


def files_holding(root: Path, secret: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def test_presigned_url_is_stored_nowhere(ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    """`ftx run URL?X-Amz-Signature=…` then `ftx configure URL -o DIR`: the signature is in no log line,
    no provenance, no deployment record, no copied repository (a server on 127.0.0.1 plays S3)."""
    from fetch_helpers import LocalServer, write_archive
    from test_fetch_pipeline import checkpoint_entries

    archive = write_archive(tmp_path / "tiny-gptj.tar.zst", checkpoint_entries(tiny_gptj_dir))
    with LocalServer() as server:
        server.serve_bytes("/bucket/tiny-gptj.tar.zst", archive.read_bytes())
        url = server.url(f"/bucket/tiny-gptj.tar.zst?X-Amz-Credential=AKIA%2F{SIGNATURE}&X-Amz-Signature={SIGNATURE}")
        ran = ftx_cli("--log-format", "json", "-v", "run", url, "--until", "configure", "--runtime", "python")
        assert ran.exit_code == 0, ran.stderr
        placed = ftx_cli("--log-format", "json", "configure", url, "--runtime", "python", "-o", str(tmp_path / "o"))
        assert placed.exit_code == 0, placed.stderr
    assert json.loads((tmp_path / "o" / "ftx-deployment.json").read_text())["source"]["ref"].endswith("?<redacted>")
    for result in (ran, placed):
        assert SIGNATURE not in result.stderr + result.stdout
    assert files_holding(ftx_home, SIGNATURE) == []
    assert files_holding(tmp_path / "o", SIGNATURE) == []


def test_log_lines_redact_urls_and_tokens_wherever_they_appear() -> None:
    """An event that carries a presigned URL or a token in any field is redacted by the log processor."""
    import structlog
    from ftx.log import configure_logging

    configure_logging("json")
    try:
        buffer = io.StringIO()
        structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=buffer))
        structlog.get_logger("t").warning("x.happened", note=f"GET https://h/p?sig={SIGNATURE} with {HF_SECRET}",
                                          nested={"urls": [f"https://user:{SIGNATURE}@h/p"]})
        line = buffer.getvalue()
    finally:
        structlog.reset_defaults()
    assert "x.happened" in line and SIGNATURE not in line and HF_SECRET not in line


def test_package_labels_carry_no_signature(tmp_path: Path) -> None:
    """Labels are built from the repository's deployment record (here one an older ftx wrote, unredacted)
    and the run's provenance; both may hold the URL. Docker itself is not needed to read the labels."""
    from ftx.docker_runtime.package import PackageInputs, package_labels

    repo = tmp_path / "repo"
    repo.mkdir()
    url = f"https://s3.example/b/m.tar.zst?X-Amz-Signature={SIGNATURE}"
    (repo / "ftx-deployment.json").write_text(json.dumps({"source": {"ref": url}, "model": url}))
    inputs = PackageInputs(repository=repo, tag="t:1", base_image="b:1", provenance={"source": url, "model": url})
    labels = package_labels(inputs, "sha256:base", {})
    assert labels["org.ftx.source"] == "https://s3.example/b/m.tar.zst?<redacted>"
    assert SIGNATURE not in json.dumps(labels)


def test_docker_serve_spec_has_no_token_and_a_redacted_model_label(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The container spec the fastertransformer runtime would start (fake GPUs: none here)."""
    from ftx.docker_runtime import gpus as gpus_mod
    from ftx.docker_runtime.gpus import Gpu
    from ftx.docker_runtime.options import DockerOptions
    from ftx.docker_runtime.serve import plan_serve
    from ftx.settings import RunSettings

    fake = (Gpu(0, "NVIDIA H100 80GB HBM3", (9, 0)),)
    monkeypatch.setattr(gpus_mod, "local_gpus", lambda: fake)
    monkeypatch.setenv("HF_TOKEN", HF_SECRET)
    url = f"https://s3.example/b/m.tar.zst?X-Amz-Signature={SIGNATURE}"
    settings = RunSettings.of(url, runtime="fastertransformer")
    options = DockerOptions(env={"HF_TOKEN": HF_SECRET, "HUGGING_FACE_HUB_TOKEN": HF_SECRET, "FT_LOG_LEVEL": "DEBUG"})
    plan = plan_serve(repository=tmp_path, checkpoints=[], settings=settings, family="gptj", options=options,
                      gemm=None, home=tmp_path)
    assert plan.spec.environment["FT_LOG_LEVEL"] == "DEBUG"
    assert plan.spec.labels["org.ftx.model"] == "https://s3.example/b/m.tar.zst?<redacted>"
    spec = repr(plan.spec) + plan.spec.docker_run_line()
    assert HF_SECRET not in spec and SIGNATURE not in spec


def test_tritonserver_inherits_no_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real tritonserver started with HF_TOKEN (and friends) in ftx's environment: its /proc environ lacks them."""
    from importlib.util import find_spec

    if find_spec("pytriton") is None:
        pytest.skip("nvidia-pytriton is not installed")
    from ftx.triton.server import TritonServer
    from triton_helpers import add_one_model

    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, HF_SECRET)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # not a secret: kept
    repo = tmp_path / "repo"
    add_one_model(repo, "add_one")
    with TritonServer(repo, home=tmp_path / "home", exit_timeout_s=5) as server:
        environ = Path(f"/proc/{server.pid}/environ").read_bytes()
    assert HF_SECRET.encode() not in environ
    assert b"TOKENIZERS_PARALLELISM=false" in environ
