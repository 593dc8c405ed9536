"""GPT-NeoX support for ftx (EleutherAI GPT-NeoX-20B, Pythia, h2oGPT)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ftx_triton import hookimpl

if TYPE_CHECKING:
    from ftx_gptneox.family import GPTNeoX

__all__ = ["ftx_register_families"]


@hookimpl
def ftx_register_families() -> list[type[GPTNeoX]]:
    from ftx_gptneox.family import GPTNeoX  # when families are asked for: `ftx --help` loads the plugin, not numpy

    return [GPTNeoX]
