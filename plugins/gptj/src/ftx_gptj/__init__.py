"""GPT-J support for ftx."""

from __future__ import annotations

from ftx import hookimpl
from ftx_gptj.family import GPTJ

__all__ = ["GPTJ", "ftx_register_families"]


@hookimpl
def ftx_register_families() -> list[type[GPTJ]]:
    return [GPTJ]
