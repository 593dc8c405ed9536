"""tritonserver's administrative APIs and the key that restricts them, shared by every launcher that binds
an address wider than loopback (kept free of imports: the Docker launcher's plan reads it too)."""

from __future__ import annotations

ADMIN_APIS = "model-repository,shared-memory,logging,trace"
"""tritonserver's API groups that change the server (its names for --grpc-restricted-protocol)."""
ADMIN_KEY_HEADER = "ftx-admin-key"
"""The header (HTTP) or metadata key (gRPC) that carries the key of the restricted APIs."""


def admin_restriction(key: str) -> str:
    """The value of ``--http-restricted-api`` / ``--grpc-restricted-protocol``: :data:`ADMIN_APIS` only for
    requests whose :data:`ADMIN_KEY_HEADER` is ``key``."""
    return f"{ADMIN_APIS}:{ADMIN_KEY_HEADER}={key}"


__all__ = ["ADMIN_APIS", "ADMIN_KEY_HEADER", "admin_restriction"]
