"""Which file is this, without reading it: the one :class:`FileIdentity` (device, inode, size, mtime and ctime in
ns), in the three forms ftx keeps it.

A file that still has the identity it had when it was hashed still holds the bytes it held then: a write in place
moves ctime even when mtime is set back, and a file replaced under its name has a new inode. The store records it
beside each output's sha256 (:meth:`FileIdentity.as_record`, read back by :meth:`FileIdentity.from_record`), the
local-source keys hash its text (:meth:`FileIdentity.token`), and the digests of files ftx just wrote are handed
over only while it is unchanged (:mod:`ftx_triton.io.hashing`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple


class FileIdentity(NamedTuple):
    """What identifies a file's bytes without reading them."""

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        """The identity in a ``stat`` (or ``lstat``/``fstat``) result."""
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def token(self) -> str:
        """Its text form, ``device:inode:size:mtime_ns:ctime_ns`` (what the local-source keys hash)."""
        return ":".join(map(str, self))

    def as_record(self) -> dict[str, int]:
        """Its fields by name, as the store records them beside an output's sha256."""
        return self._asdict()

    @classmethod
    def from_record(cls, record: Mapping[str, object]) -> FileIdentity | None:
        """The identity a record written by :meth:`as_record` holds; None when one of its fields is missing or not a
        whole number (a record in an older or damaged form: the file it describes is read again, never taken
        for unchanged)."""
        values: list[int] = []
        for name in cls._fields:
            value = record.get(name)
            if not isinstance(value, int) or isinstance(value, bool):  # a bool is an int, and no identity
                return None
            values.append(value)
        return cls(*values)


__all__ = ["FileIdentity"]
