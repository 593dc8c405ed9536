"""What one client may hold of a front (:class:`Limits`), without the server: the supervisor reads them to size
tritonserver's stack before it starts tritonserver, and imports the front (aiohttp) only after."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_BODY_BYTES = 64 * 1024 * 1024
"""Default body limit (tritonserver's later releases default --http-max-input-size to the same)."""


@dataclass(frozen=True)
class Limits:
    """What one client may hold of a front."""

    max_body_bytes: int = MAX_BODY_BYTES
    header_timeout_s: float = 30.0
    body_timeout_s: float = 300.0
    idle_timeout_s: float = 120.0
    max_connections: int = 512

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> Limits:
        """The limits named in ``spec`` (others default); keys are the field names."""
        return cls(**{k: type(getattr(cls, k))(v) for k, v in spec.items() if k in cls.__dataclass_fields__ and v})
