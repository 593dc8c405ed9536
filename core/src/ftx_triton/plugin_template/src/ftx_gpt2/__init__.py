"""GPT-2 support for ftx: the plugin template's worked example."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ftx_triton import hookimpl

if TYPE_CHECKING:
    from ftx_gpt2.family import GPT2

FTX_PLUGIN_API = (2, 2)
"""The ftx plugin API versions this plugin supports (core refuses it outside this range)."""


@hookimpl
def ftx_register_families() -> list[type[GPT2]]:
    from ftx_gpt2.family import GPT2  # when families are asked for: `ftx --help` loads the plugin, not numpy

    return [GPT2]
