"""Imports made ahead of need, while something slower runs (a model loading), so that the code that needs the
modules later finds them in ``sys.modules``.

A module that fails to import here is left alone: Python forgets a failed import, so the code that needs it
imports it again and reports what it raises, where it would have without this.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterable


def import_ahead(names: Iterable[str]) -> None:
    """Import each of ``names`` now, ignoring any failure (see the module docstring)."""
    for name in names:
        with contextlib.suppress(Exception):
            importlib.import_module(name)


__all__ = ["import_ahead"]
