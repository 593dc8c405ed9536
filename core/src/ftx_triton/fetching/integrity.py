"""Checksum arguments of the fetchers."""

from __future__ import annotations

import re

from ftx_triton.errors import SourceError

_SHA256_RE = re.compile(r"^(?:sha256:)?([0-9a-f]{64})$")


def normalize_sha256(value: str | None) -> str | None:
    """Return 64 lower-case hex digits (``sha256:`` prefix allowed), None for None."""
    if value is None:
        return None
    match = _SHA256_RE.match(value.strip().lower())
    if not match:
        raise SourceError(
            f"invalid sha256 checksum {value!r}",
            hint="give the 64 hex digits printed by `sha256sum FILE` (optionally prefixed with 'sha256:')",
        )
    return match.group(1)
