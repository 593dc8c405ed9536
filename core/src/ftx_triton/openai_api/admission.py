"""Admission control at the OpenAI endpoint: an overloaded deployment answers 429 at once, saying when to retry.

The bound itself is Triton's: the ``fastertransformer`` model's dynamic batcher has a bounded queue
(``ftx run --max-queue-size N --queue-timeout-ms T``), and refuses a request it cannot queue, or one that
waited past its timeout, with its own error. The endpoint turns that error into OpenAI's rate-limit answer
(HTTP 429, ``rate_limit_exceeded``) with ``Retry-After``: the seconds a request has recently taken to
complete (:class:`RetryAdvice`), at least one, so a client backs off for about one generation.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

from aiohttp import web

RETRY_AFTER_MIN_S = 1
RETRY_AFTER_MAX_S = 60


class RetryAdvice:
    """``Retry-After`` seconds from the latencies of the last requests that completed."""

    def __init__(self, window: int = 64) -> None:
        self.latencies: deque[float] = deque(maxlen=window)

    def completed(self, seconds: float) -> None:
        self.latencies.append(seconds)

    def seconds(self) -> int:
        if not self.latencies:
            return RETRY_AFTER_MIN_S
        typical = statistics.median(self.latencies)
        return max(RETRY_AFTER_MIN_S, min(RETRY_AFTER_MAX_S, math.ceil(typical)))


ADVICE = RetryAdvice()
"""The endpoint process's advice (one deployment per process)."""


def overloaded_response(message: str, advice: RetryAdvice = ADVICE) -> web.Response:
    """OpenAI's rate-limit error with ``Retry-After``, for a request the model's queue refused."""
    retry = advice.seconds()
    body = {
        "error": {
            "message": f"the model is overloaded and refused the request ({message}); retry in {retry} s",
            "type": "rate_limit_exceeded",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    return web.json_response(body, status=429, headers={"Retry-After": str(retry)})


__all__ = ["ADVICE", "RetryAdvice", "overloaded_response"]
