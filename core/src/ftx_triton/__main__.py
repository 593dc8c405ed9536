"""``python -m ftx_triton``."""

from ftx_triton.cli import main

main()
