"""structlog without rich, for the processes that log into a server log: the python runtime's stubs, the supervisor.

structlog imports rich, when it is installed, for one thing: rendering an exception as a rich traceback
(``structlog.dev``, ``structlog.tracebacks``). That import is 0.1-0.2 s of CPU (rich's console, pretty-printer,
syntax highlighting), on the critical path of a model's load in the stub. These processes never render through it:
they do not configure structlog, so their events are structlog's default console lines in the server log, and an
exception there is a plain traceback instead of a boxed one. rich itself stays importable for any later import.

structlog also imports asyncio (0.02-0.04 s) for its async logging methods alone (``ainfo``, ...), which ftx never
calls at start: its modules get a stand-in that imports asyncio at first use. Any other ``import asyncio`` is the
real one. Nor does it need colorama outside Windows (its colours are the same ANSI codes, which structlog writes
itself when colorama is missing): hidden there as rich is.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

HIDDEN = "rich"
NOT_NEEDED = ("colorama",) if sys.platform != "win32" else ()
"""Hidden from structlog beside rich where not imported yet."""
DEFERRED = "asyncio"


class _ImportedOnUse(ModuleType):
    """Stands for :data:`DEFERRED` in the modules imported beside it: the real module at first attribute use."""

    def __getattr__(self, name: str) -> Any:
        if sys.modules.get(self.__name__) is self:  # used while they import: the real module from now on
            del sys.modules[self.__name__]
        return getattr(__import__(self.__name__), name)


def import_structlog() -> ModuleType:
    """``import structlog``, without rich when neither is imported yet (else as it is)."""
    if "structlog" in sys.modules or HIDDEN in sys.modules:
        import structlog

        return structlog
    hidden = [name for name in (HIDDEN, *NOT_NEEDED) if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # its import raises ImportError, which structlog expects
    stand_in = sys.modules.setdefault(DEFERRED, _ImportedOnUse(DEFERRED))
    try:
        import structlog
    finally:
        for name in hidden:
            if sys.modules.get(name, ...) is None:
                del sys.modules[name]
        if sys.modules.get(DEFERRED) is stand_in and isinstance(stand_in, _ImportedOnUse):
            del sys.modules[DEFERRED]
    return structlog


__all__ = ["import_structlog"]
