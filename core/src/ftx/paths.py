"""Where ftx keeps its state: ``FTX_HOME`` or the platform's user cache directory."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def ftx_home() -> Path:
    """Return (and create) the ftx home: ``$FTX_HOME`` or the user cache dir."""
    home = Path(os.environ.get("FTX_HOME") or platformdirs.user_cache_dir("ftx")).expanduser()
    home.mkdir(parents=True, exist_ok=True)
    return home
