"""KoGPT support for ftx (kakaobrain/kogpt; a GPT-J, built on ftx-triton-gptj)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ftx_triton import hookimpl

if TYPE_CHECKING:
    from ftx_kogpt.family import KoGPT

__all__ = ["ftx_register_families"]


@hookimpl
def ftx_register_families() -> list[type[KoGPT]]:
    from ftx_kogpt.family import KoGPT  # when families are asked for: `ftx --help` loads the plugin, not numpy

    return [KoGPT]
