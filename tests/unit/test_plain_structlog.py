"""structlog without rich in the processes that log into a server log (``ftx_triton/plain_structlog.py``)."""

from __future__ import annotations

import pytest
from fresh_python import fresh_report

REPORT = """
import json, sys
{setup}
report = {{"rich_after": "rich" in sys.modules, "structlog": "structlog" in sys.modules}}
import structlog.dev, rich.console  # rich itself still imports
report["structlog_sees_rich"] = structlog.dev.rich is not None
print(json.dumps(report))
"""


@pytest.mark.parametrize(
    "setup",
    [
        "from ftx_triton.plain_structlog import import_structlog; import_structlog()",
        "import ftx_triton.runtime.python.triton_model",  # the stub's model module, through its package
        "from ftx_triton.server.supervisor import _import_after_spawn; _import_after_spawn()",  # once it spawned
    ],
)
def test_structlog_is_imported_without_rich(setup: str) -> None:
    report = fresh_report(REPORT.format(setup=setup))
    assert report == {"rich_after": False, "structlog": True, "structlog_sees_rich": False}


def test_where_rich_or_structlog_came_first_nothing_changes() -> None:
    setup = "import rich\nfrom ftx_triton.plain_structlog import import_structlog; import_structlog()"
    assert fresh_report(REPORT.format(setup=setup))["structlog_sees_rich"] is True
    setup = "import structlog\nfrom ftx_triton.plain_structlog import import_structlog; import_structlog()"
    assert fresh_report(REPORT.format(setup=setup))["structlog_sees_rich"] is True


ASYNC_REPORT = """
import json, sys
from ftx_triton.plain_structlog import import_structlog
structlog = import_structlog()
report = {"asyncio_after": "asyncio" in sys.modules, "colorama_after": "colorama" in sys.modules}
import asyncio
async def log() -> None:
    await structlog.get_logger().ainfo("logged from a coroutine")
asyncio.run(log())
report["real_asyncio"] = structlog.stdlib.asyncio.get_running_loop is asyncio.get_running_loop
print(json.dumps(report))
"""


def test_structlog_imports_asyncio_at_its_first_use_and_no_colorama() -> None:
    """structlog's asyncio (for its async methods alone) is imported when one is called, not with structlog; nor is
    colorama imported (structlog writes the same colour codes itself outside Windows)."""
    report = fresh_report(ASYNC_REPORT)
    assert report == {"asyncio_after": False, "colorama_after": False, "real_asyncio": True}
