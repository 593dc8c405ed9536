"""ftx plugin for the gptneox family (its table arrives in a later change)."""

from __future__ import annotations

from ftx import hookimpl


@hookimpl
def ftx_register_families() -> list[type]:
    return []
