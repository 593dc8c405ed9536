"""structlog without rich, for the processes that log into a server log: the python runtime's stubs, the supervisor.

structlog imports rich, when it is installed, for one thing: rendering an exception as a rich traceback
(``structlog.dev``, ``structlog.tracebacks``). That import is 0.1-0.2 s of CPU (rich's console, pretty-printer,
syntax highlighting), on the critical path of a model's load in the stub. These processes never render through it:
they do not configure structlog, so their events are structlog's default console lines in the server log, and an
exception there is a plain traceback instead of a boxed one. rich itself stays importable for any later import.
"""

from __future__ import annotations

import sys
from types import ModuleType

HIDDEN = "rich"


def import_structlog() -> ModuleType:
    """``import structlog``, without rich when neither is imported yet (else as it is)."""
    if "structlog" in sys.modules or HIDDEN in sys.modules:
        import structlog

        return structlog
    sys.modules[HIDDEN] = None  # type: ignore[assignment]  # `import rich` raises ImportError, which structlog expects
    try:
        import structlog
    finally:
        if sys.modules.get(HIDDEN, ...) is None:
            del sys.modules[HIDDEN]
    return structlog


__all__ = ["import_structlog"]
