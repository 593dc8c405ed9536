"""The one path policy of the HTTP front: what it forwards is what its checks saw.

tritonserver matches its routes on the request path as sent, resolving no ``.``/``..`` segment and
decoding no ``%XX`` (``/v2/./logging`` and ``/v2/%6Cogging`` are 404 on its own port). An HTTP client
library would resolve them (yarl turns ``/v2/x/../logging`` into ``/v2/logging``), so a check of the
path as received and a forward of the path as resolved could disagree. Hence:

* :func:`forwarded_path` refuses (400) a path with a dot segment, spelled plainly or percent-encoded
  (``.``, ``..``, ``%2e``, ``%2E%2E``, ``.%2e``), or with an encoded separator (``%2F``, ``%5C``) or a
  backslash: tritonserver serves no such path, and refusing them leaves every spelling of one route a
  single one; the rest is forwarded byte for byte (never re-resolved);
* :func:`checked_path` is what checks match: that path percent-decoded, empty segments (``//``)
  collapsed, so one spelling of a route is all a check needs to know.
"""

from __future__ import annotations

import re
from http import HTTPStatus
from urllib.parse import unquote

from ftx_triton.front.server import Refused

_SEPARATOR = re.compile(r"%(?:2f|5c)|\\", re.IGNORECASE)
_SLASHES = re.compile(r"/{2,}")


def forwarded_path(raw_path: str) -> str:
    """``raw_path`` (the path of the request target, as sent) if it may be forwarded as it is;
    :class:`Refused` (400) for a dot segment or an encoded separator."""
    if _SEPARATOR.search(raw_path):
        raise Refused(
            HTTPStatus.BAD_REQUEST,
            f"the path {raw_path[:120]!r} holds an encoded '/' or a backslash, which no route of this server has",
        )
    if any(unquote(segment) in (".", "..") for segment in raw_path.split("/")):
        raise Refused(
            HTTPStatus.BAD_REQUEST,
            f"the path {raw_path[:120]!r} has a '.' or '..' segment (plain or percent-encoded); "
            "send the path without it",
        )
    return raw_path


def checked_path(raw_path: str) -> str:
    """The form of ``raw_path`` that checks match: percent-decoded, repeated slashes as one."""
    return _SLASHES.sub("/", unquote(raw_path))


__all__ = ["checked_path", "forwarded_path"]
