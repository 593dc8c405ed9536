"""ftx.fetching.hub and hf:// refs against a fake Hub on 127.0.0.1 (HF_ENDPOINT points at it).

The fake answers what huggingface_hub asks for a snapshot: ``GET /api/models/{repo}/revision/{rev}``
(model_info / repo_info), ``GET /api/models/{repo}/tree/{rev}?recursive=true`` (the file listing that
huggingface_hub 1.x and later snapshots from) and ``HEAD``/``GET /{repo}/resolve/{commit}/{file}`` with
``X-Repo-Commit``, ``ETag``, ``Content-Length`` (and ``X-Linked-Etag``/``X-Linked-Size`` for LFS files).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from fetch_helpers import LocalServer, payload, send_body, send_status
from ftx.errors import SourceError
from ftx.fetching.hub import download_snapshot, list_repo_files
from ftx.fetching.refs import parse_ref, resolve_revision
from structlog.testing import capture_logs

REPO = "acme/tiny-gptj"
MAIN = "a" * 40
DEV = "0123456789abcdef0123456789abcdef01234567"
SECRET = "hf_SeCrEtT0kenThatMustNeverBePrinted"
PATTERNS = [
    "config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "tokenizer*",
    "*.model",
    "generation_config.json",
]
WANTED = [
    "config.json",
    "generation_config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
]
UNWANTED = ["pytorch_model.bin", "flax_model.msgpack", "tf_model.h5", "onnx/model.onnx", "README.md", ".gitattributes"]


def repo_files(flavour: str) -> dict[str, bytes]:
    files = {name: f"{flavour}:{name}".encode() for name in WANTED + UNWANTED}
    files["model-00001-of-00002.safetensors"] = payload(300_000, seed=1)
    return files


@dataclass
class FakeHub:
    """One repository with branches ``main`` and ``dev``; optionally gated behind ``token``."""

    branches: dict[str, str] = field(default_factory=lambda: {"main": MAIN, "dev": DEV})
    files: dict[str, dict[str, bytes]] = field(
        default_factory=lambda: {MAIN: repo_files("main"), DEV: repo_files("dev")}
    )
    token: str | None = None
    licence_accepted: bool = True
    gate_files_only: bool = False  # like the real Hub: metadata is public, files are gated

    def __call__(self, h: BaseHTTPRequestHandler) -> None:
        if not self._authorised(h):
            return
        path = h.path.split("?")[0]
        if m := re.fullmatch(rf"/api/models/{REPO}/revision/([^/]+)", path):
            self._model_info(h, m.group(1))
        elif m := re.fullmatch(rf"/api/models/{REPO}/tree/([^/]+)/?", path):
            self._tree(h, m.group(1))
        elif m := re.fullmatch(rf"/{REPO}/resolve/([^/]+)/(.+)", path):
            self._resolve(h, m.group(1), m.group(2))
        else:
            send_status(h, 404, {"X-Error-Code": "RepoNotFound"})

    def _authorised(self, h: BaseHTTPRequestHandler) -> bool:
        if self.token is None or (self.gate_files_only and h.path.startswith("/api/")):
            return True
        if h.headers.get("Authorization") != f"Bearer {self.token}":
            send_status(h, 401, {"X-Error-Code": "GatedRepo", "X-Error-Message": "Access to this model is restricted"})
            return False
        if not self.licence_accepted:
            send_status(h, 403, {"X-Error-Code": "GatedRepo", "X-Error-Message": "Accept the licence first"})
            return False
        return True

    def _commit(self, rev: str) -> str | None:
        commit = self.branches.get(rev, rev)
        return commit if commit in self.files else None

    def _model_info(self, h: BaseHTTPRequestHandler, rev: str) -> None:
        commit = self._commit(rev)
        if commit is None:
            send_status(h, 404, {"X-Error-Code": "RevisionNotFound"})
            return
        body = {
            "id": REPO,
            "sha": commit,
            "private": False,
            "siblings": [{"rfilename": n} for n in sorted(self.files[commit])],
        }
        send_body(h, json.dumps(body).encode(), {"Content-Type": "application/json"})

    def _tree(self, h: BaseHTTPRequestHandler, rev: str) -> None:
        """The recursive listing of a revision: every file (with its LFS pointer for weights) and folder."""
        commit = self._commit(rev)
        if commit is None:
            send_status(h, 404, {"X-Error-Code": "RevisionNotFound"})
            return
        entries: list[dict[str, object]] = []
        folders = sorted({name.rsplit("/", 1)[0] for name in self.files[commit] if "/" in name})
        entries += [{"type": "directory", "path": folder, "oid": hashlib.sha1(folder.encode()).hexdigest(), "size": 0}
                    for folder in folders]
        for name, data in sorted(self.files[commit].items()):
            entry: dict[str, object] = {"type": "file", "path": name, "size": len(data),
                                        "oid": hashlib.sha1(data).hexdigest()}
            if name.endswith(".safetensors"):
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            entries.append(entry)
        send_body(h, json.dumps(entries).encode(), {"Content-Type": "application/json"})

    def _resolve(self, h: BaseHTTPRequestHandler, rev: str, name: str) -> None:
        commit = self._commit(rev)
        data = self.files.get(commit or "", {}).get(name)
        if data is None:
            send_status(h, 404, {"X-Error-Code": "EntryNotFound"})
            return
        headers = {"X-Repo-Commit": commit, "ETag": f'"{hashlib.sha1(data).hexdigest()}"'}
        if name.endswith(".safetensors"):
            headers |= {"X-Linked-Etag": f'"{hashlib.sha256(data).hexdigest()}"', "X-Linked-Size": str(len(data))}
        send_body(h, data, headers)


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    fake = FakeHub()
    with LocalServer() as server:
        server.fallback = fake
        for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HF_ENDPOINT", server.base_url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
        monkeypatch.setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
        server.fake = fake  # type: ignore[attr-defined]
        yield server


def requested_files(server: LocalServer) -> set[str]:
    return {r.path.split("/resolve/", 1)[1].split("/", 1)[1] for r in server.requests if "/resolve/" in r.path}


# --- revisions ----------------------------------------------------------------------------


def test_branch_resolves_to_its_commit_and_is_remembered(hub: LocalServer, tmp_path: Path) -> None:
    assert resolve_revision(parse_ref(f"hf://{REPO}@dev")) == DEV
    assert resolve_revision(parse_ref(f"hf://{REPO}")) == MAIN
    assert resolve_revision(parse_ref(f"https://huggingface.co/{REPO}/tree/dev")) == DEV
    api = f"/api/models/{REPO}/revision"
    assert [r.path for r in hub.seen("GET")] == [f"{api}/dev", f"{api}/main", f"{api}/dev"]
    refs = tmp_path / "hf-home" / "hub" / "models--acme--tiny-gptj" / "refs"
    assert (refs / "dev").read_text() == DEV


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
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(SourceError, match="cannot be reached"):
        resolve_revision(parse_ref(f"hf://{REPO}"))
    make_hf_cache(tmp_path / "hf-home", MAIN, {"config.json": b"{}"})
    with capture_logs() as events:
        assert resolve_revision(parse_ref(f"hf://{REPO}")) == MAIN
    assert [e["event"] for e in events] == ["hub.resolved", "hub.offline_fallback"]
    with pytest.raises(SourceError, match="cannot be reached"):
        download_snapshot(REPO, MAIN, tmp_path / "snap", PATTERNS, progress=False)
