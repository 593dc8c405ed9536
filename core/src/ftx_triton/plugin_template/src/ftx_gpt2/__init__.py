"""GPT-2 support for ftx: the plugin template's worked example."""

from __future__ import annotations

from ftx_triton import hookimpl

from ftx_gpt2.family import GPT2

FTX_PLUGIN_API = (2, 2)
"""The ftx plugin API versions this plugin supports (core refuses it outside this range)."""


@hookimpl
def ftx_register_families() -> list[type[GPT2]]:
    return [GPT2]
