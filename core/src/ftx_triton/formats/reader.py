"""What the converter needs from a checkpoint: :class:`TensorReader`, without numpy (the plugin API names it, and a
cached convert or run loads the plugins without reading a tensor)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np


class TensorReader(Protocol):
    """What the converter needs from a checkpoint."""

    def names(self) -> list[str]:
        """Tensor names in storage order (reading in this order is sequential I/O)."""

    def shape(self, name: str) -> tuple[int, ...]:
        """Shape without reading data."""

    def nbytes(self, name: str) -> int:
        """Stored size in bytes."""

    def read(self, name: str) -> np.ndarray:
        """Load one tensor (may be a read-only view of a memory map)."""

    def close(self) -> None:
        """Release files."""
