"""tritonserver answers that misname a client's mistake, answered by the front as what they are.

* ``generate`` on a model that streams (decoupled, ``ftx run --streaming``): tritonserver runs the
  request, then answers **200** with a body of only ``{"error": "generate expects model to produce
  exactly 1 response, use generate stream …"}``: a 400 naming ``generate_stream``;
* a value of the wrong JSON type for an input (``"NaN"`` or ``"2"`` as a string for an FP32 or INT64
  input, a number for a text input): tritonserver's **500** ``Unable to parse …``, its own fault by its
  status: a 400 (the request is wrong, not the server).

Only small JSON answers without a ``Content-Encoding`` are read (errors and ``generate`` answers are);
everything else passes through untouched.
"""

from __future__ import annotations

import json
import re
from http import HTTPStatus

MAX_READ_BYTES = 1 << 20
"""The most of an answer read to classify it (an error or a non-streamed generate answer is far smaller)."""
_GENERATE = re.compile(r"/v2/models/([^/]+)(?:/versions/[^/]+)?/generate/?", re.IGNORECASE)
_STREAMS = re.compile(r"\bgenerate stream\b", re.IGNORECASE)
_TYPE_MISMATCH = re.compile(r"Unable to parse ")


def worth_reading(method: str, path: str, status: int) -> bool:
    """Whether an answer of ``status`` to ``method path`` (the checked path) may need another status."""
    return method == "POST" and (
        status == HTTPStatus.INTERNAL_SERVER_ERROR
        or (status == HTTPStatus.OK and _GENERATE.fullmatch(path) is not None)
    )


def reclassified(path: str, status: int, body: bytes) -> tuple[int, str] | None:
    """(status, message) the answer ``body`` deserves instead, or None to pass it on as it is."""
    try:
        answer = json.loads(body)
    except ValueError:
        return None
    if not (isinstance(answer, dict) and set(answer) == {"error"} and isinstance(answer["error"], str)):
        return None
    message = answer["error"]
    generate = _GENERATE.fullmatch(path)
    if status == HTTPStatus.OK and generate is not None and _STREAMS.search(message):
        model = generate.group(1)
        return HTTPStatus.BAD_REQUEST, (
            f"model {model!r} streams its answers (it was deployed with --streaming), so generate cannot "
            f"answer in one piece: send the request to /v2/models/{model}/generate_stream instead "
            f"(tritonserver: {message})"
        )
    if status == HTTPStatus.INTERNAL_SERVER_ERROR and _TYPE_MISMATCH.match(message):
        return HTTPStatus.BAD_REQUEST, (
            f"{message} (a value of the wrong JSON type for its input: numbers as JSON numbers, "
            "text as JSON strings; JSON has no NaN or Infinity)"
        )
    return None


__all__ = ["MAX_READ_BYTES", "reclassified", "worth_reading"]
