"""GPT-NeoX support for ftx (EleutherAI GPT-NeoX-20B, Pythia, h2oGPT)."""

from __future__ import annotations

from ftx_triton import hookimpl

from ftx_gptneox.family import GPTNeoX

__all__ = ["GPTNeoX", "ftx_register_families"]


@hookimpl
def ftx_register_families() -> list[type[GPTNeoX]]:
    return [GPTNeoX]
