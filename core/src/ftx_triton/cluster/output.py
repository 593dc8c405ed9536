"""Writing what a cluster launcher exports (a batch script, manifests) where the user asked."""

from __future__ import annotations

import os
from pathlib import Path

from ftx_triton.errors import ConfigError


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically; a link or special file there is refused, never replaced (as root a
    rename over /dev/null would turn it into a text file)."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise ConfigError(
            f"{path} exists and is not a regular file", hint="write to a path that is absent or a regular file"
        )
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}", hint="choose a writable path") from None
