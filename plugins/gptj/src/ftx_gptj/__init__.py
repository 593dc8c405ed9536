"""GPT-J support for ftx."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ftx_triton import hookimpl

if TYPE_CHECKING:
    from ftx_gptj.family import GPTJ

__all__ = ["FTX_PLUGIN_API", "ftx_register_families"]

FTX_PLUGIN_API = (2, 2)
"""The range of ftx plugin API versions this plugin supports."""


@hookimpl
def ftx_register_families() -> list[type[GPTJ]]:
    from ftx_gptj.family import GPTJ  # when families are asked for: `ftx --help` loads the plugin, not numpy

    return [GPTJ]
