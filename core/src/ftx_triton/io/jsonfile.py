"""JSON files of a checkpoint (config.json, index files, tokenizer.json) read with one clear error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ftx_triton.errors import CheckpointError
from ftx_triton.io.regular import TooLarge, read_regular

_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean", type(None): "null"}


def json_kind(value: object) -> str:
    """How JSON calls the type of ``value`` (``an array``, ``a string`` …)."""
    return _KINDS.get(type(value), type(value).__name__)


MAX_JSON_BYTES = 1 << 30
"""The largest JSON file of a checkpoint ftx reads (tokenizer.json files run to tens of MB)."""


def read_json_object(path: Path, *, hint: str) -> dict[str, Any]:
    """The JSON object in ``path``; :class:`CheckpointError` (with ``hint``) when it is unreadable,
    not a regular file, larger than MAX_JSON_BYTES, not JSON, or JSON of another type. A missing file
    raises ``FileNotFoundError`` for the caller."""
    try:
        data = json.loads(read_regular(Path(path), MAX_JSON_BYTES))
    except FileNotFoundError:
        raise
    except TooLarge:
        raise CheckpointError(
            f"{path} is larger than {MAX_JSON_BYTES >> 20} MB, too large for a JSON file of a checkpoint", hint=hint
        ) from None
    except (OSError, ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, a directory …
        raise CheckpointError(f"{path} is not valid JSON ({type(exc).__name__}: {exc})"[:300], hint=hint) from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} is not a JSON object (it holds {json_kind(data)})", hint=hint)
    return data
