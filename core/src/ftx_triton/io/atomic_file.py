"""Writing one file so that a reader finds the old one or the new one, never half of either: the one helper for it
(ftx's records, the files a command exports where the user asked).

The bytes go to a temp file beside the target (``.<name>.<random>.tmp``, made with ``O_EXCL``: no two writers,
threads or hosts sharing a home, ever share one), which one ``os.replace`` puts in its place. A write that fails
removes its temp file; one killed half-way leaves it, under a name no reader of ftx's records takes for a record
(they read ``*.json`` or one fixed name). No ``fsync``: a record a power loss damages is ftx's own, dropped and
written again when read back damaged. Written here rather than taken from a library: the kept ones
(``atomicwrites`` is unmaintained) bring more than these few lines.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_atomic(path: Path, data: str | bytes, *, mode: int = 0o666, tmp: Path | None = None) -> None:
    """Put ``data`` (text is written as UTF-8) in ``path`` at once; its parent must exist.

    ``mode``: the new file's permissions (less the umask, as ``open`` does); ``tmp``: the temp file to write first,
    where one beside ``path`` will not do (it must be on the same file system). A link at ``path`` is replaced,
    never followed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp") if tmp is None else Path(tmp)
    payload = data.encode() if isinstance(data, str) else data
    created = False
    try:
        with open(tmp, "xb", opener=lambda name, flags: os.open(name, flags | os.O_CLOEXEC, mode)) as out:
            created = True
            out.write(payload)
        os.replace(tmp, path)
    except BaseException:
        if created:  # never a file of the same name that this call did not make
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise


def write_json_atomic(
    path: Path,
    value: Any,
    *,
    indent: int | None = None,
    sort_keys: bool = False,
    default: Callable[[Any], Any] | None = None,
    mode: int = 0o666,
    tmp: Path | None = None,
) -> None:
    """:func:`write_atomic` of ``value`` as JSON (``indent``, ``sort_keys``, ``default`` as ``json.dumps`` takes them)."""
    write_atomic(path, json.dumps(value, indent=indent, sort_keys=sort_keys, default=default), mode=mode, tmp=tmp)


__all__ = ["write_atomic", "write_json_atomic"]
