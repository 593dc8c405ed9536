"""The chunked digest (``ftx_triton.io.hashing.chunked_digests``) spelled out independently of ftx's code, for the
tests that pin its definition: a change of chunk size, order or version string is a change of every key and record."""

from __future__ import annotations

import hashlib


def spelled_out(data: bytes, chunk: int) -> str:
    """sha256 of the version string, the size and each ``chunk``-byte piece's sha256 in order."""
    parts = b"".join(hashlib.sha256(data[i : i + chunk]).digest() for i in range(0, len(data), chunk))
    return hashlib.sha256(b"ftx-chunked-sha256-v1\0" + f"{len(data)}\0".encode() + parts).hexdigest()
