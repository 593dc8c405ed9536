"""Writing what a cluster launcher exports (a batch script, manifests) where the user asked."""

from __future__ import annotations

from pathlib import Path

from ftx_triton.errors import ConfigError
from ftx_triton.io.atomic_file import write_atomic


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically; a link or special file there is refused, never replaced (as root a
    rename over /dev/null would turn it into a text file)."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise ConfigError(
            f"{path} exists and is not a regular file", hint="write to a path that is absent or a regular file"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}", hint="choose a writable path") from None
