"""Write installed-looking distributions (a .dist-info with entry points, plus a module) into a
directory, so plugin discovery runs through the real importlib.metadata machinery."""

from __future__ import annotations

import textwrap
from pathlib import Path


def make_dist(
    root: Path, dist: str, module: str, source: str, *, entry_point: str | None = None, version: str = "1.0.0"
) -> Path:
    """Create ``root/<module>.py`` and ``root/<dist>-<version>.dist-info`` registering it in group ``ftx``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[ftx]\n{entry_point or module} = {module}\n")
    return root
