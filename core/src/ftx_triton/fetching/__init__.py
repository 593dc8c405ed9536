"""Fetching model sources: Hugging Face revisions, URLs and archives, local directories.

The library behind the core's default ``ftx_fetch`` hook: it parses and pins references,
downloads (resumable, retried, checksum-verified), extracts archives safely, and shows byte
progress on a terminal. Publishing the result as an artifact is the core's job.
"""

from __future__ import annotations

from typing import Any

from ftx_triton.fetching.archive import is_archive, safe_extract
from ftx_triton.fetching.http import download
from ftx_triton.fetching.integrity import normalize_sha256
from ftx_triton.fetching.local_keys import local_content_key, local_fingerprint
from ftx_triton.fetching.refs import parse_ref, resolve_revision
from ftx_triton.io.hashing import sha256_file

_FROM_HUB = ("download_snapshot", "list_repo_files")


def __getattr__(name: str) -> Any:
    """The Hugging Face functions, imported on first use: huggingface_hub takes a noticeable part of a second,
    which a run of a local or cached source does not need."""
    if name in _FROM_HUB:
        from ftx_triton.fetching import hub

        return getattr(hub, name)
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
