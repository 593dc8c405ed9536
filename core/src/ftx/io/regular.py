"""Opening a checkpoint's files, which come from strangers: regular files only.

A named pipe blocks ``open()`` until a writer comes (forever), and a device such as ``/dev/zero`` never
ends, so a file is opened without blocking, checked to be a regular file (links followed), and only then
handed out as an ordinary blocking file object.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from ftx.errors import CheckpointError

_KINDS = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened for binary reading when it is a regular file; CheckpointError otherwise. A missing
    file raises ``FileNotFoundError`` for the caller."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise CheckpointError(f"{path} is {kind}, not a file ftx can read",
                                  hint="a checkpoint holds regular files (or links to them); put the real file there")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
