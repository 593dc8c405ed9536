"""A fake Hugging Face Hub on 127.0.0.1 (HF_ENDPOINT points at it), shared by the fetch tests.

It answers what huggingface_hub asks for a snapshot: ``GET /api/models/{repo}/revision/{rev}``
(model_info / repo_info), ``GET /api/models/{repo}/tree/{rev}?recursive=true`` (the file listing that
huggingface_hub 1.x and later snapshots from) and ``HEAD``/``GET /{repo}/resolve/{commit}/{file}`` with
``X-Repo-Commit``, ``ETag``, ``Content-Length`` (and ``X-Linked-Etag``/``X-Linked-Size`` for LFS files).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from fetch_helpers import payload, send_body, send_status

REPO = "acme/tiny-gptj"


MAIN = "a" * 40


DEV = "0123456789abcdef0123456789abcdef01234567"


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
        entries += [
            {"type": "directory", "path": folder, "oid": hashlib.sha1(folder.encode()).hexdigest(), "size": 0}
            for folder in folders
        ]
        for name, data in sorted(self.files[commit].items()):
            entry: dict[str, object] = {
                "type": "file",
                "path": name,
                "size": len(data),
                "oid": hashlib.sha1(data).hexdigest(),
            }
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
