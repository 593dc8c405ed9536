"""The one family of errors a user can act on.

Anything raised that is not an :class:`FtxError` is a bug and keeps its traceback.
The CLI prints an ``FtxError`` as ``error: <message>`` and ``hint: <hint>`` and exits 1.
"""

from __future__ import annotations


class FtxError(Exception):
    """A problem the user can fix; ``hint`` says how."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class PluginError(FtxError):
    """A plugin failed to load, registered a duplicate family, or broke a hook contract."""


class FamilyResolutionError(FtxError):
    """No family (or more than one) matches a model."""


class SourceError(FtxError):
    """A model source cannot be found, fetched or read."""


class CheckpointError(FtxError):
    """A weight file is unreadable, truncated, or disagrees with config.json."""


class MappingError(FtxError):
    """Tensors the family table does not map, or tensors it needs that are missing."""


class ConfigError(FtxError):
    """An option, config.ini or config.pbtxt value is invalid or inconsistent."""


class OutputError(FtxError):
    """An output location cannot be used (e.g. it already holds something else)."""


class ToolError(FtxError):
    """An external tool (tritonserver, gpt_gemm, docker) failed."""


class ServeError(FtxError):
    """A server did not start, or stopped serving."""


class ResourceError(FtxError):
    """Disk or memory would not hold what a run is about to make."""


class LicenseError(FtxError):
    """A model's licence needs an explicit acceptance that was not given."""
