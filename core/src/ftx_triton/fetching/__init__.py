"""Fetching model sources: Hugging Face revisions, URLs and archives, local directories.

The library behind the core's default ``ftx_fetch`` hook: it parses and pins references,
downloads (resumable, retried, checksum-verified), extracts archives safely, and shows byte
progress on a terminal. Publishing the result as an artifact is the core's job.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "is_archive": "archive",
    "safe_extract": "archive",
    "download": "http",
    "normalize_sha256": "integrity",
    "local_content_key": "local_keys",
    "local_fingerprint": "local_keys",
    "parse_ref": "refs",
    "resolve_revision": "refs",
    "download_snapshot": "hub",
    "list_repo_files": "hub",
}
"""Each name's module. Every one is imported on first use: huggingface_hub takes a noticeable part of a second, and
downloads and archives (http, ssl, tarfile, zipfile, zstandard) tens of milliseconds, which a run of a local or
cached source does not need (it parses its reference through :mod:`~ftx_triton.fetching.refs`, which imports this
package first)."""


def __getattr__(name: str) -> Any:
    if name == "sha256_file":
        from ftx_triton.io.hashing import sha256_file

        return sha256_file
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "download",
    "download_snapshot",
    "is_archive",
    "list_repo_files",
    "local_content_key",
    "local_fingerprint",
    "normalize_sha256",
    "parse_ref",
    "resolve_revision",
    "safe_extract",
    "sha256_file",
]
