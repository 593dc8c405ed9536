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
