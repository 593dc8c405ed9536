"""Where ftx writes a directory the user named (``ftx plugin new --dir``, ``ftx convert -o``): checked first.

One check for every such option, before anything is made: the path must be able to become a directory (not
below a file, not on a file system where nothing can be made such as ``/proc``, a name the system takes),
and a link is followed, so a link to an empty folder is written where it points. What the check makes to
prove it is removed again.
"""

from __future__ import annotations

import errno
from pathlib import Path

from ftx_triton.errors import OutputError, file_system_error


def output_error(exc: OSError, option: str, path: Path) -> OutputError:
    """The error a user sees when ``path`` (given as ``option``) cannot be written."""
    shorter = " and a name of at most 255 bytes a part" if exc.errno == errno.ENAMETOOLONG else ""
    return file_system_error(exc) or OutputError(
        f"cannot create {option} {path}: {exc.strerror or exc}",
        hint=f"choose a {option} in a directory you can write to{shorter}",
    )


def check_output_place(output: Path, option: str) -> Path:
    """The absolute directory ``output`` names (links resolved), once it is known it can be created there.

    Raises :class:`OutputError` (naming ``option``) when it cannot; leaves nothing behind.
    """
    try:
        output = output.expanduser().resolve()
        existing = next(path for path in (output, *output.parents) if path.exists() or path == path.parent)
        if not existing.is_dir():
            raise OutputError(
                f"{option} {output}: {existing} exists and is not a directory",
                hint=f"choose a {option} in a directory you can write to",
            )
        missing = [path for path in (output, *output.parents) if not path.exists()]
        output.mkdir(parents=True, exist_ok=True)  # made and removed again: nothing is left if a later step fails
        for path in missing:
            path.rmdir()
    except OSError as exc:
        raise output_error(exc, option, output) from None
    return output


__all__ = ["check_output_place", "output_error"]
