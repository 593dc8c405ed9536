"""ftx: deploy language models on Triton with FasterTransformer.

This module is the plugin-author surface; everything else is internal.
"""

from __future__ import annotations

import pluggy

hookimpl = pluggy.HookimplMarker("ftx")
"""Marker for plugin hook implementations: ``@ftx.hookimpl``."""

PLUGIN_API_VERSION = 1
"""Version of the hook and Family API; plugins declare the range they support."""


def __getattr__(name: str) -> object:
    if name == "__version__":
        from importlib.metadata import version

        return version("ftx")
    raise AttributeError(name)
