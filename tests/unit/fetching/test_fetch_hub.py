"""ftx_triton.fetching.hub and hf:// refs against a fake Hub on 127.0.0.1 (HF_ENDPOINT points at it).

The fake answers what huggingface_hub asks for a snapshot: ``GET /api/models/{repo}/revision/{rev}``
(model_info / repo_info), ``GET /api/models/{repo}/tree/{rev}?recursive=true`` (the file listing that
huggingface_hub 1.x and later snapshots from) and ``HEAD``/``GET /{repo}/resolve/{commit}/{file}`` with
``X-Repo-Commit``, ``ETag``, ``Content-Length`` (and ``X-Linked-Etag``/``X-Linked-Size`` for LFS files).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import pytest
from fetch_helpers import LocalServer
from ftx_triton.errors import SourceError
from ftx_triton.fetching.hub import download_snapshot, list_repo_files
from ftx_triton.fetching.refs import parse_ref, resolve_revision
from hub_fake import DEV, MAIN, REPO, UNWANTED, WANTED, FakeHub, repo_files
from structlog.testing import capture_logs

SECRET = "hf_SeCrEtT0kenThatMustNeverBePrinted"
PATTERNS = [
    "config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "tokenizer*",
    "*.model",
    "generation_config.json",
]


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    fake = FakeHub()
    with LocalServer() as server:
        server.fallback = fake
        for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HF_ENDPOINT", server.base_url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.setenv("FTX_HOME", str(tmp_path / "ftx-home"))
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
        monkeypatch.setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
        server.fake = fake  # type: ignore[attr-defined]
        yield server


def requested_files(server: LocalServer) -> set[str]:
    return {r.path.split("/resolve/", 1)[1].split("/", 1)[1] for r in server.requests if "/resolve/" in r.path}


# --- revisions ----------------------------------------------------------------------------


def test_branch_resolves_to_its_commit_and_is_remembered(
    hub: LocalServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve_revision(parse_ref(f"hf://{REPO}@dev")) == DEV
    assert resolve_revision(parse_ref(f"hf://{REPO}")) == MAIN
    assert resolve_revision(parse_ref(f"https://huggingface.co/{REPO}/tree/dev")) == DEV
    api = f"/api/models/{REPO}/revision"
    assert [r.path for r in hub.seen("GET")] == [f"{api}/dev", f"{api}/main", f"{api}/dev"]
    asked = len(hub.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # remembered: offline, the branch resolves to the commit it had
    assert resolve_revision(parse_ref(f"hf://{REPO}@dev")) == DEV
    assert len(hub.requests) == asked
    assert not (tmp_path / "hf-home" / "hub" / "models--acme--tiny-gptj" / "refs").exists()  # HF's cache untouched


def test_commit_needs_no_request_and_unknown_revision_is_explained(hub: LocalServer) -> None:
    assert resolve_revision(parse_ref(f"hf://{REPO}", revision=DEV.upper())) == DEV
    assert hub.requests == []
    with pytest.raises(SourceError, match="revision 'nope' does not exist") as err:
        resolve_revision(parse_ref(f"hf://{REPO}@nope"))
    assert "branch, tag or 40-hex commit" in err.value.hint


def test_parse_hf_refs() -> None:
    ref = parse_ref(f"hf://{REPO}@dev")
    assert (ref.kind, ref.uri, ref.revision) == ("hf", f"hf://{REPO}", "dev")
    assert parse_ref("hf://t5-3b", revision="main").revision == "main"
    with pytest.raises(SourceError, match="two revisions"):
        parse_ref(f"hf://{REPO}@dev", revision="main")
    with pytest.raises(SourceError, match="invalid Hugging Face repository"):
        parse_ref("hf://a/b/c")


# --- snapshots ----------------------------------------------------------------------------


def test_snapshot_downloads_only_allowed_files_at_the_pinned_commit(hub: LocalServer, tmp_path: Path) -> None:
    dest = tmp_path / "snap"
    commit = resolve_revision(parse_ref(f"hf://{REPO}@dev"))
    assert list_repo_files(REPO, commit) == sorted(WANTED + UNWANTED)
    files = download_snapshot(REPO, commit, dest, PATTERNS, progress=False)
    assert files == [dest / name for name in WANTED]
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == WANTED
    assert (dest / "config.json").read_bytes() == b"dev:config.json"
    assert requested_files(hub) == set(WANTED)
    assert all(f"/resolve/{DEV}/" in r.path for r in hub.requests if "/resolve/" in r.path)
    assert not (dest / ".cache").exists()


def test_no_matching_file_lists_what_the_repo_has(hub: LocalServer, tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"no file of acme/tiny-gptj@0123456789ab matches \['\*.gguf'\]") as err:
        download_snapshot(REPO, DEV, tmp_path / "snap", ["*.gguf"], progress=False)
    assert "config.json" in err.value.message and err.value.hint


def test_branch_name_is_refused_by_download_snapshot(hub: LocalServer, tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="40-hex commit") as err:
        download_snapshot(REPO, "main", tmp_path / "snap", PATTERNS)
    assert "resolve_revision" in err.value.hint


# --- gated repositories and the token -----------------------------------------------------


@pytest.mark.parametrize(
    ("token", "accepted", "says"),
    [
        (None, True, "no Hugging Face token was found"),
        ("hf_wrong", True, "token was refused or has not been granted access"),
        (SECRET, False, "token was refused or has not been granted access"),
    ],
)
def test_gated_repo_gives_token_and_licence_fix(
    hub: LocalServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, token: str | None, accepted: bool, says: str
) -> None:
    hub.fake.token, hub.fake.licence_accepted = SECRET, accepted  # type: ignore[attr-defined]
    if token:
        monkeypatch.setenv("HF_TOKEN", token)
    with pytest.raises(SourceError) as err:
        resolve_revision(parse_ref(f"hf://{REPO}"))
    with pytest.raises(SourceError) as err2:
        download_snapshot(REPO, MAIN, tmp_path / "snap", PATTERNS, token=token, progress=False)
    for error in (err.value, err2.value):
        assert REPO in error.message and says in error.message
        assert "HF_TOKEN" in error.hint and f"{hub.base_url}/{REPO}" in error.hint
        assert "hf_wrong" not in str(error) + error.hint and SECRET not in str(error) + error.hint
    assert {r.headers.get("Authorization") is not None for r in hub.requests} == {token is not None}
    assert hub.seen(path=f"/api/models/{REPO}/revision/main")
    assert requested_files(hub) == set()


@pytest.mark.parametrize("token", [None, SECRET])
def test_gated_files_behind_public_metadata(
    hub: LocalServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, token: str | None
) -> None:
    hub.fake.token, hub.fake.licence_accepted, hub.fake.gate_files_only = SECRET, False, True  # type: ignore[attr-defined]
    if token:
        monkeypatch.setenv("HF_TOKEN", token)
    commit = resolve_revision(parse_ref(f"hf://{REPO}"))
    with pytest.raises(SourceError) as err:
        download_snapshot(REPO, commit, tmp_path / "snap", PATTERNS, progress=False)
    assert "gated" in err.value.message and "HF_TOKEN" in err.value.hint and f"{REPO}" in err.value.hint
    assert SECRET not in str(err.value) + err.value.hint
    assert ("no Hugging Face token was found" in err.value.message) == (token is None)


def test_token_is_used_but_never_logged(
    hub: LocalServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    hub.fake.token = SECRET  # type: ignore[attr-defined]
    monkeypatch.setenv("HF_TOKEN", SECRET)
    caplog.set_level(logging.DEBUG)
    with capture_logs() as events:
        commit = resolve_revision(parse_ref(f"hf://{REPO}@main"))
        download_snapshot(REPO, commit, tmp_path / "snap", PATTERNS, progress=False)
    assert {r.headers["Authorization"] for r in hub.requests} == {f"Bearer {SECRET}"}
    assert {e["event"] for e in events} >= {"hub.resolved", "download.started", "download.finished"}
    out, err = capfd.readouterr()
    for text in (repr(events), caplog.text, out, err):
        assert SECRET not in text


# --- offline ------------------------------------------------------------------------------


def make_hf_cache(home: Path, commit: str, files: dict[str, bytes], ref: str = "main") -> Path:
    """The layout huggingface_hub writes: blobs/, snapshots/<commit>/ symlinks, refs/<branch>."""
    repo = home / "hub" / "models--acme--tiny-gptj"
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = repo / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../" * (name.count("/") + 2)) / "blobs" / blob.name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    return repo


def test_offline_uses_the_local_snapshot(hub: LocalServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_hf_cache(tmp_path / "hf-home", MAIN, repo_files("cached"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    commit = resolve_revision(parse_ref(f"hf://{REPO}"))
    assert list_repo_files(REPO, commit) == sorted(WANTED + UNWANTED)
    files = download_snapshot(REPO, commit, tmp_path / "snap", PATTERNS, progress=False)
    assert commit == MAIN and [f.name for f in files] == WANTED
    assert (tmp_path / "snap" / "config.json").read_bytes() == b"cached:config.json"
    assert not (tmp_path / "snap" / "config.json").is_symlink()
    assert hub.requests == []


def test_offline_without_a_snapshot_says_how_to_fix_it(
    hub: LocalServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SourceError, match="HF_HUB_OFFLINE is set") as err:
        resolve_revision(parse_ref(f"hf://{REPO}@dev"))
    assert "unset HF_HUB_OFFLINE" in err.value.hint
    with pytest.raises(SourceError, match="not in the local Hugging Face cache") as err:
        download_snapshot(REPO, DEV, tmp_path / "snap", PATTERNS)
    assert "HF_HUB_OFFLINE" in err.value.hint
    assert hub.requests == []


def test_unreachable_hub_falls_back_to_the_cached_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with LocalServer() as server:  # started and stopped: nothing listens on its port any more
        endpoint = server.base_url
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("FTX_HOME", str(tmp_path / "ftx-home"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(SourceError, match="cannot be reached"):
        resolve_revision(parse_ref(f"hf://{REPO}"))
    make_hf_cache(tmp_path / "hf-home", MAIN, {"config.json": b"{}"})
    with capture_logs() as events:
        assert resolve_revision(parse_ref(f"hf://{REPO}")) == MAIN
    assert [e["event"] for e in events] == ["hub.resolved", "hub.offline_fallback"]
    with pytest.raises(SourceError, match="cannot be reached"):
        download_snapshot(REPO, MAIN, tmp_path / "snap", PATTERNS, progress=False)
