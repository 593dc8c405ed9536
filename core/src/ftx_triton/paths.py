"""Where ftx keeps its state: ``FTX_HOME`` or the platform's user cache directory."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import platformdirs

from ftx_triton.errors import ConfigError


def ftx_home() -> Path:
    """Return (and create) the ftx home: ``$FTX_HOME`` or the user cache dir."""
    home = Path(os.environ.get("FTX_HOME") or platformdirs.user_cache_dir("ftx")).expanduser()
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise unusable_home(home, exc) from exc
    return home


def unusable_home(home: Path, exc: OSError) -> ConfigError:
    """The error for an ftx home that cannot be created or written (a file, below a file, read-only, …)."""
    if exc.errno == errno.EEXIST:
        why = "it is a file"
    elif exc.errno == errno.ENOTDIR:
        why = "a directory above it is a file"
    else:
        reason = exc.strerror or str(exc)
        why = reason[:1].lower() + reason[1:] + (f": {exc.filename}" if exc.filename else "")
    name = f"FTX_HOME={home}" if os.environ.get("FTX_HOME") else f"ftx's home {home}"
    return ConfigError(
        f"{name} is not a directory ftx can use ({why})",
        hint="point FTX_HOME at a writable directory (or unset it to use the user cache directory)",
    )
