"""Moved to :mod:`ftx_triton.server.processes` (process inspection belongs to the server layer); this name stays
only for the CLI modules another change is rewriting (``cli/serving.py``, ``cli/bench.py``, ``cli/chat.py``) and is
removed once they import the new place."""

from ftx_triton.server.processes import ServedModel, served_models

__all__ = ["ServedModel", "served_models"]
