"""Hostile input and faults: each bad input or fault of issue #14 that ftx now handles cleanly.

Every case is a real input through the real code (the CLI in-process via click's CliRunner,
or the store on a real FTX_HOME); each failed before its fix. Bad input ends in exit 1 with
``error:`` and ``hint:`` lines, no traceback, and nothing half-written that a later run trusts.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest
from cli_helpers import assert_clean_failure, events, run_until_configure
from ftx_triton.io.atomic import new_holder
from ftx_triton.store.artifact_store import PROVENANCE_FILE, ArtifactStore

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
    "output-without-digest": rewrite_meta(lambda m: [o.pop("chunked_sha256") for o in m["outputs"].values()]),
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
        assert all(len(o["chunked_sha256"]) == 64 for o in outputs.values()), meta_path


@pytest.mark.parametrize(
    ("stage", "rel"), [("convert", "1-gpu/model.wte.bin"), ("configure", "preprocessing/1/model.py")]
)
def test_same_size_edit_in_the_store_is_caught_by_the_cli(
    ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, stage: str, rel: str
) -> None:
    run_until_configure(ftx_cli, tiny_gptj_dir)
    (art,) = (ftx_home / "store" / stage).iterdir()
    original = (art / rel).read_bytes()
    flip_same_size(art / rel)
    again = run_until_configure(ftx_cli, tiny_gptj_dir)
    evs = events(again.stderr)
    assert any(e["event"] == "cache.corrupt" and e["stage"] == stage for e in evs)
    assert stage in [e["stage"] for e in evs if e["event"] == "stage.finished"]
    assert (art / rel).read_bytes() == original


def test_bytecode_left_by_serving_is_dropped_and_the_artifact_still_counts(
    ftx_cli, ftx_home: Path, tiny_gptj_dir: Path
) -> None:
    """Triton's Python stub writes ``__pycache__`` beside the models it imports from a configure artifact;
    the next lookup removes it (a planted .pyc must not run) and the artifact is still a cache hit, while
    any other unrecorded file still makes it untrusted."""
    run_until_configure(ftx_cli, tiny_gptj_dir)
    (art,) = (ftx_home / "store" / "configure").iterdir()
    for model in ("fastertransformer", "preprocessing"):
        cache = art / model / "1" / "__pycache__"
        cache.mkdir()
        (cache / "model.cpython-311.pyc").write_bytes(b"planted bytecode")
    again = run_until_configure(ftx_cli, tiny_gptj_dir)
    evs = events(again.stderr)
    assert "configure" in [e["stage"] for e in evs if e["event"] == "cache.hit"]
    assert not [e for e in evs if e["event"] == "cache.corrupt"] and not list(art.rglob("__pycache__"))
    (art / "preprocessing" / "1" / "planted.py").write_text("import os\n")
    evs = events(run_until_configure(ftx_cli, tiny_gptj_dir).stderr)
    assert any(e["event"] == "cache.corrupt" and e["stage"] == "configure" for e in evs)


def test_unreadable_provenance_does_not_stop_runs(ftx_cli, ftx_home: Path, tiny_gptj_dir: Path) -> None:
    run_until_configure(ftx_cli, tiny_gptj_dir)
    for meta_path in (ftx_home / "store").glob(f"*/*/{PROVENANCE_FILE}"):
        meta_path.write_text("[1, 2")
    again = run_until_configure(ftx_cli, tiny_gptj_dir)
    assert [e["stage"] for e in events(again.stderr) if e["event"] == "stage.finished"] == [
        "fetch",
        "convert",
        "tune",
        "configure",
    ]


@pytest.mark.parametrize("result", [{"bogus": 1}, [1, 2], "x", {"path": 5, "ref": None}])
def test_unusable_result_record_is_rebuilt(ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, result: object) -> None:
    """Provenance whose stage result cannot be turned back into the typed record (hand-edited, or an
    older schema) is rebuilt instead of ending every run in a TypeError."""
    run_until_configure(ftx_cli, tiny_gptj_dir)
    for meta_path in (ftx_home / "store").glob(f"*/*/{PROVENANCE_FILE}"):
        meta = json.loads(meta_path.read_text())
        meta["result"] = result
        meta_path.write_text(json.dumps(meta))
    again = run_until_configure(ftx_cli, tiny_gptj_dir)
    evs = events(again.stderr)
    assert [e["stage"] for e in evs if e["event"] == "stage.finished"] == ["fetch", "convert", "tune", "configure"]
    assert {e["stage"] for e in evs if e["event"] == "cache.corrupt"} == {"fetch", "convert", "tune", "configure"}


KILL_BETWEEN_RENAMES = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from ftx_triton.store.artifact_store import ArtifactStore
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
    proc = subprocess.run(
        [sys.executable, "-c", KILL_BETWEEN_RENAMES, str(ftx_home)], check=False, capture_output=True, timeout=60
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not art.path.exists()  # the window the kill landed in
    hit, cached = build_three_files(store, tag=b"v2")
    assert cached and (hit.path / "1-gpu" / "model.wte.bin").read_bytes() == b"v1" * 1000
    leftovers = [p.name for p in [*(ftx_home / "store" / "convert").iterdir(), *store.tmp_root.iterdir()]]
    assert leftovers == ["k"]


def test_stale_build_and_old_directories_are_removed_under_the_lock(ftx_home: Path) -> None:
    store = ArtifactStore(ftx_home)
    art, _ = build_three_files(store)
    stale = [store.tmp_root / "convert-k-999-deadbeef", store.tmp_root / "old-k-deadbeef"]
    for path in stale:
        path.mkdir()
        (path / "w.bin").write_bytes(b"x")
    stale += [new_holder(art.path, "old"), new_holder(art.path, "tmp")]  # beside the artifact, as a kill leaves them
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
    from fetch_helpers import LocalServer, checkpoint_entries, write_archive

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


@pytest.mark.parametrize("how", ["presigned", "user-info", "--source of a preset"])
def test_ftx_lock_refuses_a_url_with_credentials(
    ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """ftx.toml is meant to be committed: it once got the whole presigned URL, and stderr printed it."""
    from fetch_helpers import LocalServer, checkpoint_entries, write_archive

    archive = write_archive(tmp_path / "tiny-gptj.tar.zst", checkpoint_entries(tiny_gptj_dir))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    with LocalServer() as server:
        server.serve_bytes("/bucket/tiny-gptj.tar.zst", archive.read_bytes())
        signed = server.url(f"/bucket/tiny-gptj.tar.zst?X-Amz-Signature={SIGNATURE}")
        args = {
            "presigned": [signed],
            "--source of a preset": ["tiny-gptj", "--source", signed],
            "user-info": [signed.split("?")[0].replace("://", f"://me:{SIGNATURE}@")],
        }[how]
        result = ftx_cli("lock", *args)
        assert server.requests == []  # refused before any download
    assert_clean_failure(result, "carries credentials", "ftx run URL")
    assert f"{server.base_url}/bucket/tiny-gptj.tar.zst" in result.stderr
    assert SIGNATURE not in result.stderr + result.stdout
    assert not (work / "ftx.toml").exists()
    assert files_holding(ftx_home, SIGNATURE) == [] and files_holding(work, SIGNATURE) == []


def test_log_lines_redact_urls_and_tokens_wherever_they_appear() -> None:
    """An event that carries a presigned URL or a token in any field is redacted by the log processor."""
    import structlog
    from ftx_triton.terminal.log import configure_logging

    configure_logging("json")
    try:
        buffer = io.StringIO()
        structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=buffer))
        structlog.get_logger("t").warning(
            "x.happened",
            note=f"GET https://h/p?sig={SIGNATURE} with {HF_SECRET}",
            nested={"urls": [f"https://user:{SIGNATURE}@h/p"]},
        )
        line = buffer.getvalue()
    finally:
        structlog.reset_defaults()
    assert "x.happened" in line and SIGNATURE not in line and HF_SECRET not in line


def test_malformed_urls_are_redacted_too() -> None:
    """urlsplit refuses an unclosed IPv6 bracket: redaction (of a log line, an error) must not."""
    from ftx_triton.terminal.redact import redact, redact_url

    assert redact_url(f"http://u:{SIGNATURE}@[::1/x?sig={SIGNATURE}") == "http://[::1/x?<redacted>"
    assert SIGNATURE not in redact(f"GET http://[::1/p?sig={SIGNATURE} failed")


def test_package_labels_carry_no_signature(tmp_path: Path) -> None:
    """Labels are built from the repository's deployment record (here one an older ftx wrote, unredacted)
    and the run's provenance; both may hold the URL. Docker itself is not needed to read the labels."""
    from ftx_triton.runtime.fastertransformer.docker.package import PackageInputs, package_labels

    repo = tmp_path / "repo"
    repo.mkdir()
    url = f"https://s3.example/b/m.tar.zst?X-Amz-Signature={SIGNATURE}"
    (repo / "ftx-deployment.json").write_text(json.dumps({"source": {"ref": url}, "model": url}))
    inputs = PackageInputs(repository=repo, tag="t:1", base_image="b:1", provenance={"source": url, "model": url})
    labels = package_labels(inputs, "sha256:base", {})
    assert labels["org.ftx.source"] == "https://s3.example/b/m.tar.zst?<redacted>"
    assert SIGNATURE not in json.dumps(labels)


def test_docker_serve_spec_has_no_token_and_a_redacted_model_label(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The container spec the fastertransformer runtime would start (fake GPUs: none here)."""
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.runtime.fastertransformer import gpus as gpus_mod
    from ftx_triton.runtime.fastertransformer.docker.options import DockerOptions
    from ftx_triton.runtime.fastertransformer.docker.serve import plan_serve
    from ftx_triton.runtime.fastertransformer.gpus import Gpu

    fake = (Gpu(0, "NVIDIA H100 80GB HBM3", (9, 0)),)
    monkeypatch.setattr(gpus_mod, "local_gpus", lambda: fake)
    monkeypatch.setenv("HF_TOKEN", HF_SECRET)
    url = f"https://s3.example/b/m.tar.zst?X-Amz-Signature={SIGNATURE}"
    settings = RunSettings.of(url, runtime="fastertransformer", tp=1)
    options = DockerOptions(env={"HF_TOKEN": HF_SECRET, "HUGGING_FACE_HUB_TOKEN": HF_SECRET, "FT_LOG_LEVEL": "DEBUG"})
    plan = plan_serve(
        repository=tmp_path, checkpoints=[], settings=settings, family="gptj", options=options, gemm=None, home=tmp_path
    )
    assert plan.spec.environment["FT_LOG_LEVEL"] == "DEBUG"
    assert plan.spec.labels["org.ftx.model"] == "https://s3.example/b/m.tar.zst?<redacted>"
    spec = repr(plan.spec) + plan.spec.docker_run_line()
    assert HF_SECRET not in spec and SIGNATURE not in spec


def test_tritonserver_inherits_no_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real tritonserver started with HF_TOKEN (and friends) in ftx's environment: its /proc environ lacks them."""
    from importlib.util import find_spec

    if find_spec("pytriton") is None:
        pytest.skip("nvidia-pytriton is not installed")
    from ftx_triton.server.tritonserver import TritonServer
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


# --- bad checkpoints, configs, manifests and outputs through the real CLI ----------------------


def nothing_half_written(home: Path, out: Path) -> None:
    for stage in ("convert", "configure"):
        root = home / "store" / stage
        assert not root.exists() or not [p for p in root.iterdir() if not p.name.startswith(".")], stage
    tmp = home / "store" / ".tmp"
    assert not tmp.exists() or not any(tmp.iterdir())
    assert not out.exists() or not any(out.iterdir())


def read_safetensors(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + size]), raw[8 + size :]


def write_safetensors(path: Path, header: object, data: bytes) -> None:
    blob = header if isinstance(header, bytes) else json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(len(blob).to_bytes(8, "little") + blob + data)


def edit_header(edit: Callable[[dict, int], object]) -> Callable[[Path], None]:
    """Rewrite the checkpoint's safetensors header; ``edit(header, data_len)`` may return a replacement."""

    def apply(ckpt: Path) -> None:
        header, data = read_safetensors(ckpt / "model.safetensors")
        replaced = edit(header, len(data))
        write_safetensors(ckpt / "model.safetensors", header if replaced is None else replaced, data)

    return apply


FIRST = "lm_head.weight"  # [256, 64] F32, bytes 1024..66560


def set_entry(**fields: object) -> Callable[[dict, int], None]:
    return lambda h, n: h[FIRST].update(fields)


def drop_field(field: str) -> Callable[[dict, int], None]:
    def drop(header: dict, data_len: int) -> None:
        del header[FIRST][field]

    return drop


SAFETENSORS_CASES: dict[str, tuple[Callable[[dict, int], object], str]] = {
    "header-a-list": (lambda h, n: [h], "not a JSON object"),
    "header-not-utf8": (lambda h, n: b"\xff\xfe{}", "not a readable safetensors file"),
    "entry-not-an-object": (lambda h, n: h.update({FIRST: 5}), FIRST),
    "offsets-missing": (drop_field("data_offsets"), FIRST),
    "offsets-one-number": (set_entry(data_offsets=[1024]), FIRST),
    "offsets-not-numbers": (set_entry(data_offsets=["a", "b"]), FIRST),
    "offsets-negative": (set_entry(data_offsets=[-65536, 1024]), FIRST),
    "offsets-reversed": (set_entry(data_offsets=[66560, 1024]), FIRST),
    "offsets-past-the-end": (lambda h, n: h[FIRST].update(data_offsets=[1024, n + 65536]), "truncated"),
    "offsets-both-past-the-end": (lambda h, n: h[FIRST].update(data_offsets=[n + 8, n + 65544]), "truncated"),
    "shape-not-a-list": (set_entry(shape="256x64"), FIRST),
    "shape-negative": (set_entry(shape=[-256, -64]), FIRST),
    "size-disagrees-with-shape": (set_entry(shape=[512, 64]), FIRST),
    "dtype-unknown": (set_entry(dtype="F8_E9M9"), FIRST),
    "dtype-missing": (drop_field("dtype"), FIRST),
    "float-relabelled-I32": (set_entry(dtype="I32"), "stored as int32"),  # item 11: the header's dtype lies
    # issue 27: the format forbids both; they were accepted
    "ranges-overlap": (set_entry(data_offsets=[0, 65536]), "share bytes"),
    "key-given-twice": (
        lambda h, n: json.dumps(h).encode()[:-1] + f', "{FIRST}": {json.dumps(h[FIRST])}}}'.encode(),
        f"names '{FIRST}' twice",
    ),
}


@pytest.mark.parametrize("case", sorted(SAFETENSORS_CASES))
def test_malformed_safetensors_header(ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path, case: str) -> None:
    edit, needle = SAFETENSORS_CASES[case]
    ckpt = shutil.copytree(tiny_gptj_dir, tmp_path / "ckpt")
    edit_header(edit)(ckpt)
    result = ftx_cli("convert", str(ckpt), "-o", str(tmp_path / "out"))
    assert_clean_failure(result, FIRST if case == "float-relabelled-I32" else "model.safetensors", needle)
    nothing_half_written(ftx_home, tmp_path / "out")


def shard(ckpt: Path) -> dict:
    """Split model.safetensors into two shards with an index; return the index."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(ckpt / "model.safetensors")
    (ckpt / "model.safetensors").unlink()
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in halves.items():
        save_file({n: tensors[n] for n in part}, ckpt / file)
    index = {"metadata": {}, "weight_map": {n: f for f, part in halves.items() for n in part}}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    return index


def outside_shard(ckpt: Path) -> str:
    """A real safetensors file next to the checkpoint directory (not in it)."""
    shutil.copy(ckpt / "model-00001-of-00002.safetensors", ckpt.parent / "elsewhere.safetensors")
    return "../elsewhere.safetensors"


def retarget(index: dict, target: str) -> dict:
    return {
        **index,
        "weight_map": {n: (target if f.startswith("model-00001") else f) for n, f in index["weight_map"].items()},
    }


INDEX_CASES: dict[str, tuple[Callable[[Path, dict], object], str]] = {
    "not-json": (lambda c, i: "{weight_map", "not valid JSON"),
    "a-list": (lambda c, i: [i], "not a JSON object"),
    "no-weight_map": (lambda c, i: {"metadata": {}}, "weight_map"),
    "weight_map-a-list": (lambda c, i: {"weight_map": list(i["weight_map"])}, "weight_map"),
    "shard-name-a-number": (lambda c, i: {"weight_map": {n: 1 for n in i["weight_map"]}}, "weight_map"),
    "shard-outside-the-checkpoint": (lambda c, i: retarget(i, outside_shard(c)), "../elsewhere.safetensors"),
    "shard-absolute-path": (lambda c, i: retarget(i, str(c / "model-00001-of-00002.safetensors")), "absolute"),
    "shard-missing": (lambda c, i: retarget(i, "model-00009-of-00009.safetensors"), "missing"),
}


@pytest.mark.parametrize("case", sorted(INDEX_CASES))
def test_invalid_index_json(ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path, case: str) -> None:
    make, needle = INDEX_CASES[case]
    ckpt = shutil.copytree(tiny_gptj_dir, tmp_path / "ckpt")
    index = make(ckpt, shard(ckpt))
    (ckpt / "model.safetensors.index.json").write_text(index if isinstance(index, str) else json.dumps(index))
    result = ftx_cli("convert", str(ckpt), "-o", str(tmp_path / "out"))
    assert_clean_failure(result, "model.safetensors.index.json", needle)
    nothing_half_written(ftx_home, tmp_path / "out")


def edit_config(edit: Callable[[dict], object]) -> Callable[[Path], None]:
    def apply(ckpt: Path) -> None:
        config = json.loads((ckpt / "config.json").read_text())
        replaced = edit(config)
        (ckpt / "config.json").write_text(json.dumps(config if replaced is None else replaced))

    return apply


CONFIG_CASES: dict[str, tuple[Callable[[Path], None], tuple[str, ...]]] = {
    "a-list": (edit_config(lambda c: [c]), ("config.json", "not a JSON object")),
    "a-string": (edit_config(lambda c: "gptj"), ("config.json", "not a JSON object")),
    "not-utf8": (lambda ckpt: (ckpt / "config.json").write_bytes(b"\xff\xfe\x00{"), ("config.json",)),
    "n_head-0": (edit_config(lambda c: c.update(n_head=0)), ("n_head", "0")),
    "n_layer-x": (edit_config(lambda c: c.update(n_layer="x")), ("n_layer", "'x'")),
    "n_layer-0": (edit_config(lambda c: c.update(n_layer=0)), ("layer",)),
    "n_layer-null": (edit_config(lambda c: c.update(n_layer=None)), ("n_layer",)),
    "n_embd-negative": (edit_config(lambda c: c.update(n_embd=-64)), ("-64",)),
    "n_head-missing": (edit_config(lambda c: c.pop("n_head")), ("n_head",)),
    "vocab_size-a-list": (edit_config(lambda c: c.update(vocab_size=[256])), ("vocab_size",)),
    # geometry FasterTransformer cannot run, once written into config.ini and published
    "n_head-not-dividing": (edit_config(lambda c: c.update(n_head=3)), ("not a multiple of n_head = 3",)),
    "rotary_dim-huge": (edit_config(lambda c: c.update(rotary_dim=10**6)), ("rotary_dim = 1000000",)),
    "rotary_dim-negative": (edit_config(lambda c: c.update(rotary_dim=-8)), ("rotary_dim = -8",)),
    "rotary_dim-odd": (edit_config(lambda c: c.update(rotary_dim=3)), ("rotary_dim = 3",)),
    # issue 27: 2.5 layers became 2; a context of 0 positions was served
    "n_layer-fraction": (edit_config(lambda c: c.update(n_layer=2.5)), ("n_layer = 2.5", "not a whole number")),
    "n_positions-0": (edit_config(lambda c: c.update(n_positions=0)), ("n_positions = 0", "positive")),
    "n_positions-fraction": (edit_config(lambda c: c.update(n_positions=255.5)), ("n_positions = 255.5",)),
}


@pytest.mark.parametrize("checked", [True, False], ids=["resource-check", "no-resource-check"])
def test_a_config_claiming_a_billion_layers_is_refused_at_once(
    ftx_cli, tiny_gptj_dir: Path, tmp_path: Path, checked: bool
) -> None:
    """ftx once expanded the tensor table for every claimed layer: 24 GB, then the OOM killer, no message.
    The size estimate refuses it now, and past that estimate the plan does before expanding anything."""
    ckpt = shutil.copytree(tiny_gptj_dir, tmp_path / "ckpt")
    edit_config(lambda c: c.update(n_layer=10**9))(ckpt)
    result = ftx_cli("convert", str(ckpt), "-o", str(tmp_path / "out"), *([] if checked else ["--no-resource-check"]))
    assert_clean_failure(
        result, *(["TB", "--no-resource-check"] if checked else ["1000000000 layers", "tensors in all"])
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_bad_config_json(ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path, case: str) -> None:
    edit, needles = CONFIG_CASES[case]
    ckpt = shutil.copytree(tiny_gptj_dir, tmp_path / "ckpt")
    edit(ckpt)
    result = ftx_cli("convert", str(ckpt), "-o", str(tmp_path / "out"))
    assert_clean_failure(result, *needles)
    nothing_half_written(ftx_home, tmp_path / "out")


def test_wrong_family_for_the_checkpoint(ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    result = ftx_cli("convert", str(tiny_gptj_dir), "--family", "gptneox", "-o", str(tmp_path / "out"))
    assert_clean_failure(result, "gptneox", "hidden_size", "--family")
    nothing_half_written(ftx_home, tmp_path / "out")


def test_tp_gpu_output_that_is_a_file(ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "1-gpu").write_text("mine")
    result = ftx_cli("convert", str(tiny_gptj_dir), "-o", str(out))
    assert_clean_failure(result, "1-gpu", "not a directory")
    assert (out / "1-gpu").read_text() == "mine"


def test_output_that_is_a_file_is_a_usage_error(ftx_cli, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    """click's own check of ``-o`` (exit 2, a usage error naming the option), before anything runs."""
    (tmp_path / "out").write_text("mine")
    result = ftx_cli("convert", str(tiny_gptj_dir), "-o", str(tmp_path / "out"))
    assert result.exit_code == 2 and "is a file" in result.stderr and "Traceback" not in result.stderr
    assert (tmp_path / "out").read_text() == "mine"


@pytest.mark.parametrize("content", [b"[1, 2]", b'"bos"', b"{not json", b"\xff\xfe"])
def test_tokenizer_config_that_is_not_an_object(
    ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path, content: bytes
) -> None:
    ckpt = shutil.copytree(tiny_gptj_dir, tmp_path / "ckpt")
    (ckpt / "tokenizer_config.json").write_bytes(content)
    result = ftx_cli("configure", str(ckpt), "--runtime", "python", "-o", str(tmp_path / "out"))
    assert_clean_failure(result, "tokenizer_config.json")
    nothing_half_written(ftx_home, tmp_path / "out")


MANIFESTS = {
    "source-a-number": ("[model]\nsource = 5\n", "source"),
    "source-a-table": ("[model]\nsource = {x = 1}\n", "source"),
    "revision-a-list": ('[model]\nsource = "hf://org/name"\nrevision = ["main"]\n', "revision"),
    "family-a-number": ('[model]\nsource = "gptj"\nfamily = 1\n', "family"),
    "requires-a-string": ('requires = "ftx"\n', "requires"),
    "requires-numbers": ("requires = [1, 2]\n", "requires"),
    "requires-unparsable": ('requires = ["ftx >>> 1"]\n[model]\nsource = "tiny-gptj"\n', "ftx >>> 1"),
    "model-a-string": ('model = "gptj"\n', "[model]"),
    "not-toml": ('[model\nsource = "gptj"\n', "ftx.toml"),
    "not-utf8": (b"\xff\xfe[model]", "ftx.toml"),
}


@pytest.mark.parametrize("case", sorted(MANIFESTS))
def test_bad_ftx_toml(ftx_cli, ftx_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    text, needle = MANIFESTS[case]
    (tmp_path / "ftx.toml").write_bytes(text if isinstance(text, bytes) else text.encode())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    result = ftx_cli("run", "--until", "fetch")
    assert_clean_failure(result, needle)
    assert not (tmp_path / "hf").exists() or not any((tmp_path / "hf").rglob("x"))


SETTINGS = {  # [settings] value -> what the error says; checked as the command line checks the option
    'tp = "two"': "tp must be an integer in 1-64 or auto, not str 'two'",
    "tp = 1.5": "tp must be an integer in 1-64 or auto, not float 1.5",
    "tp = true": "tp must be an integer in 1-64 or auto, not bool True",
    "tp = 0": "tp must be an integer in 1-64 or auto, not int 0",
    "instances = 1.5": "instances must be an integer in 1-64, not float 1.5",
    'streaming = "false"': "streaming must be true or false, not str 'false'",
    'device = "tpu"': "device must be one of auto, cpu, cuda, not str 'tpu'",
    'force = ["bogus"]': "force must be a list, each item one of fetch, convert, tune, configure, serve, not list",
    'force = "convert"': "force must be a list",
    "host = {a = 1}": "host must be a string, not dict {'a': 1}",
    'http_port = "abc"': "http_port must be an integer in 1-65535, not str 'abc'",
    "http_port = 70000": "http_port must be an integer in 1-65535, not int 70000",
    "runtime = 5": "runtime must be a string, not int 5",
    "tpp = 2": "'tpp' is no setting of `ftx run` (did you mean 'tp'?)",  # once ignored without a word
    'stream_interval = "fast"': "stream_interval must be an integer in 1-4096 or auto, not str 'fast'",
    "stream_interval = 0": "stream_interval must be an integer in 1-4096 or auto, not int 0",
    "stream_interval = -3": "stream_interval must be an integer in 1-4096 or auto, not int -3",
    'stream_interval = "4"': "stream_interval must be an integer in 1-4096 or auto, not str '4'",
}


@pytest.mark.parametrize("line", sorted(SETTINGS))
@pytest.mark.parametrize("until", ["--dry-run", "configure"])
def test_wrong_value_in_ftx_toml_settings(
    ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str, until: str
) -> None:
    """[settings] bypassed click's checks: a TypeError deep in a stage, or a wrong value taken silently."""
    manifest = tmp_path / "ftx.toml"
    manifest.write_text(
        f'[model]\nsource = {json.dumps(str(tiny_gptj_dir))}\n[settings]\nruntime = "python"\n{line}\n'.replace(
            'runtime = "python"\nruntime', "runtime"
        )
    )
    monkeypatch.chdir(tmp_path)
    result = ftx_cli("run", *(["--dry-run"] if until == "--dry-run" else ["--until", until]))
    assert_clean_failure(result, f"{manifest}: [settings] {SETTINGS[line]}", "ftx lock")
    assert not list((ftx_home / "store").glob("*/*"))  # refused before any stage ran


RUN_PARAMETERS = {  # issue 27: each was a TypeError traceback
    'model = "gptj"': ("'model' is no setting of the deployment", "[model]"),
    'prompt = "hello"': ("'prompt' is no setting of the deployment", "--prompt on the command line"),
    "max_tokens = 8": ("'max_tokens' is no setting of the deployment", "--max-tokens on the command line"),
}


@pytest.mark.parametrize("line", sorted(RUN_PARAMETERS))
def test_run_parameters_in_ftx_toml_settings_are_refused(
    ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str
) -> None:
    manifest = tmp_path / "ftx.toml"
    manifest.write_text(f"[model]\nsource = {json.dumps(str(tiny_gptj_dir))}\n[settings]\n{line}\n")
    monkeypatch.chdir(tmp_path)
    result = ftx_cli("run", "--until", "configure")
    message, hint = RUN_PARAMETERS[line]
    assert_clean_failure(result, f"{manifest}: [settings] {message}", hint)
    assert not list((ftx_home / "store").glob("*/*"))


@pytest.mark.parametrize(
    ("line", "option"),
    [
        ('host = "0.0.0.0"', "--host 0.0.0.0"),
        ('openai_host = "::"', "--openai-host ::"),
        ('host = "example.org"', "--host example.org"),
    ],
)
def test_a_committed_ftx_toml_cannot_widen_exposure(
    ftx_cli,
    ftx_home: Path,
    tiny_gptj_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    line: str,
    option: str,
) -> None:
    """Issue 27: a host = "0.0.0.0" from someone's repository exposed every endpoint without a word."""
    manifest = tmp_path / "ftx.toml"
    manifest.write_text(f'[model]\nsource = {json.dumps(str(tiny_gptj_dir))}\n[settings]\nruntime = "python"\n{line}\n')
    monkeypatch.chdir(tmp_path)
    result = ftx_cli("run", "--dry-run")
    assert_clean_failure(result, "would expose the server beyond this machine", f"pass {option} on the command line")
    flag, value = option.split(" ", 1)
    confirmed = ftx_cli("run", "--dry-run", flag, value)
    assert confirmed.exit_code == 0, confirmed.stderr
    manifest.write_text(manifest.read_text().replace(value, "127.0.0.1"))
    assert ftx_cli("run", "--dry-run").exit_code == 0


def test_stream_interval_auto_or_a_number_in_ftx_toml_is_taken(
    ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``stream_interval = "auto"`` (as `ftx lock` writes the default) and a number are taken as the command line
    takes them; the dry run says which steps the stream sends."""
    manifest = tmp_path / "ftx.toml"
    monkeypatch.chdir(tmp_path)
    for value, says in (
        ('"auto"', "interval auto: a response every ceil(requests in the batch / 4) tokens"),
        ("4", "a response every 4 tokens and the last"),
    ):
        manifest.write_text(
            f'[model]\nsource = {json.dumps(str(tiny_gptj_dir))}\n[settings]\nruntime = "python"\nstreaming = true\n'
            f"stream_interval = {value}\n"
        )
        result = ftx_cli("run", "--dry-run")
        assert result.exit_code == 0, result.stderr
        assert says in result.stdout, result.stdout


def test_settings_as_ftx_lock_writes_them_are_taken(
    ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert ftx_cli("lock", str(tiny_gptj_dir), "--http-port", "8123", "--tp", "2").exit_code == 0
    text = (tmp_path / "ftx.toml").read_text()
    (tmp_path / "ftx.toml").write_text(text.replace("[settings]\n", '[settings]\nforce = ["convert"]\n', 1))
    result = ftx_cli("run", "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert "tp=2" in result.stdout and "ports 8123/free" in result.stdout


def test_duplicate_zip_names_through_the_cli(ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    import warnings
    import zipfile

    archive = tmp_path / "dup.zip"
    with warnings.catch_warnings(), zipfile.ZipFile(archive, "w") as zf:
        warnings.simplefilter("ignore")
        for p in sorted(tiny_gptj_dir.iterdir()):
            zf.writestr(f"m/{p.name}", p.read_bytes())
        zf.writestr("m/config.json", b'{"model_type": "evil"}')
    result = ftx_cli("run", str(archive), "--until", "convert")
    assert_clean_failure(result, "m/config.json", "twice")
    assert not [p for p in (ftx_home / "store").glob("fetch/*")]


MALFORMED_URLS = {
    "unclosed IPv6 bracket": ("http://[::1/x", "Invalid IPv6 URL"),
    "not an IPv6 address": ("http://[zz]/x", "does not appear to be an IPv4 or IPv6 address"),
    "port out of range": ("http://[::1]:99999/x", "Port out of range"),
    "port not a number": ("https://host:abc/x", "abc"),
}


@pytest.mark.parametrize("command", ["convert", "run", "pull"])
@pytest.mark.parametrize("case", sorted(MALFORMED_URLS))
def test_malformed_url_source(ftx_cli, ftx_home: Path, tmp_path: Path, command: str, case: str) -> None:
    url, why = MALFORMED_URLS[case]
    extra = {"convert": ("-o", str(tmp_path / "out")), "run": ("--until", "fetch"), "pull": ()}[command]
    result = ftx_cli(command, url, *extra)
    assert_clean_failure(result, f"invalid URL {url!r}", why, "IPv6 host goes in brackets")
    assert not (tmp_path / "out").exists() and not (ftx_home / "downloads").exists()


# --- revisions that would write outside the Hugging Face cache (item 11) ------------------------

ESCAPE = "../../../x"


@pytest.fixture
def hub_answering_any_revision(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_gptj_dir: Path):
    """A fake Hub on 127.0.0.1 (no internet here) that resolves even ``../../../x`` to a commit."""
    from fetch_helpers import LocalServer
    from hub_fake import MAIN, FakeHub

    files = {p.name: p.read_bytes() for p in tiny_gptj_dir.iterdir() if p.is_file()}
    fake = FakeHub(
        branches={"main": MAIN, quote(ESCAPE, safe=""): MAIN, quote("../x", safe=""): MAIN}, files={MAIN: files}
    )
    with LocalServer() as server:
        server.fallback = fake
        for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HF_ENDPOINT", server.base_url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home" / "inner"))
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
        yield tmp_path / "hf-home"


REVISION_CASES = {
    "inline": ("run", f"hf://acme/tiny-gptj@{ESCAPE}"),
    "--revision": ("run", "hf://acme/tiny-gptj", "--revision", "../x"),
    "convert --revision": ("convert", "hf://acme/tiny-gptj", "--revision", ESCAPE, "-o", "OUT"),
    "absolute": ("run", "hf://acme/tiny-gptj@/etc/passwd"),
    "dot-lock": ("run", "hf://acme/tiny-gptj@main.lock"),
    "space": ("run", "hf://acme/tiny-gptj@main branch"),
    "ftx.toml": ("run",),  # [model] source = "hf://acme/tiny-gptj", revision = "../../../x"
}


@pytest.mark.parametrize("case", sorted(REVISION_CASES))
def test_revision_cannot_escape_the_hub_cache(
    ftx_cli, ftx_home: Path, tmp_path: Path, hub_answering_any_revision, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    args = [str(tmp_path / "out") if a == "OUT" else a for a in REVISION_CASES[case]]
    if case == "ftx.toml":
        (tmp_path / "ftx.toml").write_text(f'[model]\nsource = "hf://acme/tiny-gptj"\nrevision = "{ESCAPE}"\n')
        monkeypatch.chdir(tmp_path)
    extra = ["--until", "fetch"] if args[0] == "run" else []
    result = ftx_cli(*args, *extra)
    assert_clean_failure(result, "invalid revision")
    outside = [p for p in hub_answering_any_revision.rglob("*") if p.is_file() and "hub" not in p.parts]
    assert outside == []
    assert not (tmp_path / "out").exists()


def test_check_revision_accepts_real_revisions() -> None:
    from ftx_triton.fetching.hub import check_revision

    for ok in ("main", "v1.0", "refs/pr/1", "a" * 40, "release-2024_01+b"):
        assert check_revision(ok) == ok


def test_ftx_lock_writes_toml_that_reads_back_whatever_the_path(
    ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A source path with a quote, a backslash and a newline-looking escape once broke ftx.toml (no escaping)."""
    weird = shutil.copytree(tiny_gptj_dir, tmp_path / 'we"ird\\n dir')
    monkeypatch.chdir(tmp_path)
    locked = ftx_cli("lock", str(weird))
    assert locked.exit_code == 0, locked.stderr
    from ftx_triton.cli.manifest import load_manifest

    assert (
        load_manifest(tmp_path / "ftx.toml").model["source"] == weird.name
    )  # relative to the lock file, which is meant to be committed
    ran = ftx_cli("run", "--until", "fetch")
    assert ran.exit_code == 0, ran.stderr


# --- outputs and FTX_HOME on read-only or full file systems --------------------------------------
# Real file systems: tmpfs mounts (root only; skipped elsewhere). A chmod'ed directory is no test
# for root, who writes through permission bits.

FS_CASES = {
    "convert -o read-only": ("ro", "output", ("convert", "SRC", "-o", "MNT/out"), "read-only"),
    "configure -o read-only": (
        "ro",
        "output",
        ("configure", "SRC", "--runtime", "python", "-o", "MNT/out"),
        "read-only",
    ),
    "FTX_HOME read-only": ("ro", "home", ("run", "SRC", "--until", "convert"), "read-only"),
    "convert -o full": ("full", "output", ("convert", "SRC", "-o", "MNT/out"), "no space left"),
    "configure -o full": (
        "full",
        "output",
        ("configure", "SRC", "--runtime", "python", "-o", "MNT/out"),
        "no space left",
    ),
    # past the resource estimate (which refuses this run up front): the write itself must fail cleanly
    "FTX_HOME full": ("full", "home", ("run", "SRC", "--until", "convert", "--no-resource-check"), "no space left"),
}


@pytest.mark.parametrize("case", sorted(FS_CASES))
def test_read_only_or_full_file_system(
    ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """The converted tiny model is ~0.5 MB; the "full" tmpfs holds 256 KiB (64 KiB for a repository)."""
    from mounts import tmpfs

    kind, where, argv, needle = FS_CASES[case]
    size = "64k" if case == "configure -o full" else "256k"  # a repository without weights is ~100 KiB
    with tmpfs(tmp_path / "mnt", size=size, read_only=kind == "ro") as mnt:
        env = {"FTX_HOME": str(mnt / "home")} if where == "home" else None
        args = [str(tiny_gptj_dir) if a == "SRC" else a.replace("MNT", str(mnt)) for a in argv]
        result = ftx_cli(*args, env=env)
        assert_clean_failure(result, needle)
        if kind == "full":  # nothing half-written: no temp build or temp output left, no convert artifact
            home = mnt / "home" if where == "home" else ftx_home
            assert [p for p in (home / "store" / ".tmp").rglob("*") if p.is_file()] == []
            assert where == "output" or not list((home / "store").glob("convert/*"))
            assert [p.name for p in mnt.iterdir() if p.name.startswith(".out.") and p.suffix != ".lock"] == []
            assert not (mnt / "out" / "1-gpu").exists() and not (mnt / "out" / "ftx-deployment.json").exists()


# --- FTX_HOME that is no directory ftx can use ----------------------------------------------------

HOMES = {
    "a file": ("FILE", "it is a file", ("ls", "ps")),
    "below a file": ("FILE/sub", "a directory above it is a file", ("ls", "ps")),
    # root writes through permission bits; /proc/1 refuses even root (ps only reads FTX_HOME: not here)
    "unwritable": ("/proc/1", "no such file or directory", ("ls",)),
}


@pytest.mark.parametrize(("case", "command"), [(c, cmd) for c in sorted(HOMES) for cmd in HOMES[c][2]])
def test_ftx_home_that_is_not_a_usable_directory(ftx_cli, tmp_path: Path, case: str, command: str) -> None:
    where, why, _ = HOMES[case]
    (tmp_path / "FILE").write_text("hi\n")
    home = where.replace("FILE", str(tmp_path / "FILE"))
    result = ftx_cli(command, env={"FTX_HOME": home})
    assert_clean_failure(result, f"FTX_HOME={home} is not a directory ftx can use", why, "FTX_HOME at a writable")
    assert (tmp_path / "FILE").read_text() == "hi\n"


@pytest.mark.parametrize("command", ["pull", "run"])
@pytest.mark.parametrize(
    ("source", "sha256", "says"),
    [
        ("tiny-gptj", "not-hex", "invalid sha256 checksum 'not-hex'"),
        ("tiny-gptj", "ab" * 32, "'tiny-gptj' is a model built by ftx"),
        ("DIR", "ab" * 32, "is a directory"),
        ("hf://org/name", "ab" * 32, "is a Hugging Face repository"),
    ],
    ids=["not-hex", "builtin", "directory", "hub"],
)
def test_sha256_that_is_malformed_or_cannot_apply(
    ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, command: str, source: str, sha256: str, says: str
) -> None:
    """--sha256 was accepted and ignored for sources it cannot check (and unchecked for its form)."""
    source = str(tiny_gptj_dir) if source == "DIR" else source
    result = ftx_cli(command, source, "--sha256", sha256, *(["--dry-run"] if command == "run" else []))
    assert_clean_failure(result, says)
    assert not list((ftx_home / "store").glob("*/*"))


@pytest.mark.parametrize("value", ["-3", "0", "abc", "100000"])
def test_writer_thread_count_from_the_environment_is_checked(
    ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """FTX_CONVERT_THREADS=-3 once published a conversion without a single weight file (no writer thread ran)
    that every later run reused; abc and 100000 were tracebacks."""
    monkeypatch.setenv("FTX_CONVERT_THREADS", value)
    result = ftx_cli("convert", str(tiny_gptj_dir), "-o", str(tmp_path / "out"))
    assert_clean_failure(result, f"FTX_CONVERT_THREADS={value!r} is not an integer in 1-64")
    assert not (tmp_path / "out").exists() and not list((ftx_home / "store").glob("convert/*"))


def test_a_writer_without_threads_refuses_to_start() -> None:
    from ftx_triton.formats.writer import BackgroundWriter

    with pytest.raises(ValueError, match="at least one thread"):
        BackgroundWriter(threads=-3)


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("name", "make", "says"),
    [
        ("config.json", _fifo, "config.json is a named pipe"),
        ("config.json", _dev_zero, "config.json is a character device"),
        ("model.safetensors", _fifo, "model.safetensors is a named pipe"),
    ],
    ids=["config-fifo", "config-dev-zero", "weights-fifo"],
)
def test_special_files_in_a_checkpoint_are_refused_not_read(
    ftx_cli, tiny_gptj_dir: Path, tmp_path: Path, name: str, make: Callable[[Path], None], says: str
) -> None:
    """A named pipe once blocked ftx forever; /dev/zero as config.json grew memory until the OOM killer."""
    ckpt = shutil.copytree(tiny_gptj_dir, tmp_path / "ckpt")
    make(ckpt / name)
    result = ftx_cli("convert", str(ckpt), "-o", str(tmp_path / "out"))
    assert_clean_failure(result, says)
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(120)
def test_a_named_pipe_tokenizer_is_named_not_missing(
    ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path
) -> None:
    """Issue 27: a named-pipe tokenizer.json was reported as "no tokenizer"."""
    ckpt = shutil.copytree(tiny_gptj_dir, tmp_path / "ckpt")
    _fifo(ckpt / "tokenizer.json")
    result = ftx_cli("configure", str(ckpt), "--runtime", "python", "-o", str(tmp_path / "out"))
    assert_clean_failure(result, "tokenizer.json is a named pipe")
    nothing_half_written(ftx_home, tmp_path / "out")


def test_a_huge_sparse_tokenizer_is_refused_before_it_is_copied(
    ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 27: a sparse tokenizer.json of gigabytes was copied whole into $TMPDIR (outside FTX_HOME) before
    a JSON error; $TMPDIR here is a 16 MB tmpfs, which the old code filled (ENOSPC traceback)."""
    import tempfile

    from mounts import tmpfs

    ckpt = shutil.copytree(tiny_gptj_dir, tmp_path / "ckpt")
    with open(ckpt / "tokenizer.json", "r+b") as file:
        file.truncate(3 << 30)
    with tmpfs(tmp_path / "tmpdir", size="16m") as small:
        monkeypatch.setattr(tempfile, "tempdir", str(small))
        result = ftx_cli("configure", str(ckpt), "--runtime", "python", "-o", str(tmp_path / "out"))
        assert not any(small.iterdir())
    assert_clean_failure(result, "tokenizer.json", f"{3 << 30} bytes", "larger than any tokenizer")
    nothing_half_written(ftx_home, tmp_path / "out")


def test_nan_and_inf_weights_are_said_at_conversion_and_at_every_run(
    ftx_cli, tiny_gptj_dir: Path, tmp_path: Path
) -> None:
    """Issue 27: NaN/Inf weights converted without a word, and the served model then blamed its clients."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    ckpt = shutil.copytree(tiny_gptj_dir, tmp_path / "ckpt")
    tensors = load_file(ckpt / "model.safetensors")
    tensors["lm_head.weight"][0, 0] = np.nan
    tensors["transformer.ln_f.weight"][1] = np.inf
    save_file(tensors, ckpt / "model.safetensors")
    first = ftx_cli("run", str(ckpt), "--until", "convert")
    assert first.exit_code == 0, first.stderr
    assert "convert.non_finite" in first.stderr and "model.lm_head.weight" in first.stderr
    again = ftx_cli("--log-format", "json", "run", str(ckpt), "--until", "convert")
    assert again.exit_code == 0 and '"event": "cache.hit"' in again.stderr
    for result in (first, again):
        assert "NaN or Inf values in 2 tensor(s)" in result.stderr, result.stderr
    clean = ftx_cli("run", str(tiny_gptj_dir), "--until", "convert")
    assert clean.exit_code == 0 and "NaN" not in clean.stderr


def test_a_nearly_full_home_is_refused_before_the_built_in_model_is_built(
    ftx_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 27: with 1 MB free, building the built-in model died with a SafetensorError traceback (ENOSPC)
    and left its half-built directory; the free-space check now comes first. A real 1 MiB tmpfs."""
    from mounts import tmpfs

    with tmpfs(tmp_path / "full", size="1m") as home:
        monkeypatch.setenv("FTX_HOME", str(home))
        result = ftx_cli("run", "tiny-gptj", "--runtime", "python", "--until", "configure")
        leftovers = [p.name for p in home.rglob("*") if p.is_file() and not p.name.endswith(".lock")]
    assert_clean_failure(result, "building the built-in tiny-gptj model needs about", "free", "FTX_HOME")
    assert leftovers == []


def test_a_nearly_full_home_is_refused_before_the_python_backend_is_installed(tmp_path: Path) -> None:
    """Issue 27: with 5 MB free (here a 1 MiB tmpfs), copying the python backend into the home died with a
    shutil.Error traceback after a partial copy; the free-space check now comes first."""
    from ftx_triton.errors import ResourceError
    from ftx_triton.server.install import find_tritonserver, prepare_backends
    from mounts import tmpfs

    with tmpfs(tmp_path / "full", size="1m") as home:
        with pytest.raises(ResourceError, match="installing the python backend needs about") as err:
            prepare_backends(find_tritonserver(), home)
        assert "FTX_HOME" in (err.value.hint or "")
        assert not [p for p in home.rglob("*") if p.is_file()]
