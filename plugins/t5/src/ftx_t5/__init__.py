"""T5 support for ftx: T5ForConditionalGeneration checkpoints (v1.0 relu, v1.1 / Flan-T5 gated)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ftx_triton import hookimpl

if TYPE_CHECKING:
    from ftx_t5.family import T5

__all__ = ["FTX_PLUGIN_API", "ftx_register_families"]

FTX_PLUGIN_API = (2, 2)
"""The range of ftx plugin API versions this plugin supports."""


@hookimpl
def ftx_register_families() -> list[type[T5]]:
    from ftx_t5.family import T5  # when families are asked for: `ftx --help` loads the plugin, not numpy

    return [T5]
