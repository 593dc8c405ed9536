"""A structlog logger bound on first use, so the modules ``ftx --help`` loads (the plugin host, core's default
plugins) log like every other module without importing structlog, and rich with it, when they are imported."""

from __future__ import annotations

from typing import Any


class LazyLogger:
    """``structlog.get_logger(name)``, made when the first event is logged."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: Any = None

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        if self._logger is None:
            import structlog

            self._logger = structlog.get_logger(self._name)
        return getattr(self._logger, attr)


def get_logger(name: str) -> LazyLogger:
    return LazyLogger(name)


__all__ = ["LazyLogger", "get_logger"]
