"""Numbers read from environment variables, which come from strangers: checked, or a clear error.

click's ``envvar`` twins cover the options; these are the knobs without an option (thread counts, budgets).
"""

from __future__ import annotations

import os
from typing import overload

from ftx_triton.errors import ConfigError


@overload
def env_int(name: str, default: int, low: int, high: int) -> int: ...
@overload
def env_int(name: str, default: None, low: int, high: int) -> int | None: ...
def env_int(name: str, default: int | None, low: int, high: int) -> int | None:
    """``$name`` as an integer in ``low..high``; ``default`` when unset or empty."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise ConfigError(
            f"{name}={raw!r} is not an integer in {low}-{high}",
            hint=f"set {name} to a whole number in that range, or unset it for the default",
        )
    return value
