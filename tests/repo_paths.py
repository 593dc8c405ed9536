"""Where the tests' shared data lies, wherever a test module sits (tests/unit, tests/integration, plugins/*/tests)."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
GOLDEN_DIR = TESTS / "golden"
"""Inputs and manifests (sha256 of every file upstream wrote) of FasterTransformer's own converters
on tiny checkpoints; the outputs themselves are not stored, only their manifests."""
