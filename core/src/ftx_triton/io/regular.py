"""Opening files that come from strangers (a checkpoint's, records and provenance in the home): regular
files only.

A named pipe blocks ``open()`` until a writer comes (forever), and a device such as ``/dev/zero`` never
ends, so a file is opened without blocking, checked to be a regular file (links followed), and only then
handed out as an ordinary blocking file object; :func:`read_regular` also caps how much is read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from ftx_triton.errors import CheckpointError

_KINDS = (
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened for binary reading when it is a regular file; CheckpointError otherwise. A missing
    file raises ``FileNotFoundError`` for the caller."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise CheckpointError(
                f"{path} is {kind}, not a file ftx can read",
                hint="a checkpoint holds regular files (or links to them); put the real file there",
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class TooLarge(ValueError):
    """A file beyond the size its reader accepts."""


def read_regular(path: Path, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path``; :class:`TooLarge` beyond ``max_bytes`` (never read whole),
    CheckpointError for a pipe, device or directory, ``FileNotFoundError`` when it is missing."""
    with open_regular(path) as file:
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise TooLarge(f"larger than {max_bytes} bytes")
    return data
