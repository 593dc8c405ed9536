"""Fetching model sources: Hugging Face revisions, URLs and archives, local directories.

The library behind the core's default ``ftx_fetch`` hook: it parses and pins references,
downloads (resumable, retried, checksum-verified), extracts archives safely, and shows byte
progress on a terminal. Publishing the result as an artifact is the core's job.
"""

from __future__ import annotations

from ftx_triton.fetching.archive import is_archive, safe_extract
from ftx_triton.fetching.http import download
from ftx_triton.fetching.hub import download_snapshot, list_repo_files
from ftx_triton.fetching.integrity import normalize_sha256
from ftx_triton.fetching.local_keys import local_content_key, local_fingerprint
from ftx_triton.fetching.refs import parse_ref, resolve_revision
from ftx_triton.io.hashing import sha256_file

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
