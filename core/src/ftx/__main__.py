"""``python -m ftx``."""

from ftx.cli import main

main()
