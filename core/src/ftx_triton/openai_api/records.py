"""Moved to :mod:`ftx_triton.server.front_records` (records of what runs beside a tritonserver live with the server
records, so `ftx ps`'s process inspection in ``server/`` reads them without importing the endpoint); this name stays
only for the modules another change is rewriting (``engine/deployment.py``, ``cli/serving.py``) and is removed once
they import the new place."""

from ftx_triton.server.front_records import (
    FOREGROUND_PREFIX,
    FrontRecord,
    read_record,
    read_records,
    records_dir,
    remove_malformed_fronts,
    stop_record,
    write_record,
)

__all__ = [
    "FOREGROUND_PREFIX",
    "FrontRecord",
    "read_record",
    "read_records",
    "records_dir",
    "remove_malformed_fronts",
    "stop_record",
    "write_record",
]
