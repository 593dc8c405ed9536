"""GPT-J support for ftx."""

from __future__ import annotations

from ftx_triton import hookimpl

from ftx_gptj.family import GPTJ

__all__ = ["FTX_PLUGIN_API", "GPTJ", "ftx_register_families"]

FTX_PLUGIN_API = (2, 2)
"""The range of ftx plugin API versions this plugin supports."""


@hookimpl
def ftx_register_families() -> list[type[GPTJ]]:
    return [GPTJ]
