"""KoGPT support for ftx (kakaobrain/kogpt; a GPT-J, built on ftx-triton-gptj)."""

from __future__ import annotations

from ftx_triton import hookimpl

from ftx_kogpt.family import KoGPT

__all__ = ["KoGPT", "ftx_register_families"]


@hookimpl
def ftx_register_families() -> list[type[KoGPT]]:
    return [KoGPT]
