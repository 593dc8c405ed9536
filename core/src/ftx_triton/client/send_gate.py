"""Requests that a front takes in together reach the model together.

The OpenAI endpoint prepares each request in turn on one event loop (parse, check, tokenize: about a millisecond
each), so a burst of 64 clients used to leave it for the ``fastertransformer`` model over tens of milliseconds;
Triton's dynamic batcher, which holds a batch's first request ``--batch-delay-us`` for others, then split it into
two batches, and a closed loop's two groups took turns generating for good (docs/benchmarks.md, issue 38).
:class:`SendGate` holds each prepared request until the front has been quiet for ``quiet_s`` (no other request
prepared meanwhile), or the first has waited ``most_s``, then lets all of them go at once: a burst reaches the
model within about a millisecond whatever its length, and a lone request waits ``quiet_s``.
"""

from __future__ import annotations

import asyncio
import time

from ftx_triton.envvars import env_int

GATHER_ENV = "FTX_OPENAI_GATHER_US"
DEFAULT_GATHER_US = 2000
"""The quiet period: requests prepared less than this apart go to the model together."""
MOST_S = 0.02
"""The longest a request waits for others (a front that never falls quiet still sends)."""


class SendGate:
    """Holds requests ready to be sent until the front falls quiet, then releases them together."""

    def __init__(self, quiet_s: float, most_s: float = MOST_S) -> None:
        self.quiet_s, self.most_s = quiet_s, most_s
        self.releases = 0
        """Groups released so far (a waiter that reads it after :meth:`wait` knows which group it went with)."""
        self._open: asyncio.Event | None = None
        self._first = self._last = 0.0
        self._releaser: asyncio.Task[None] | None = None

    async def wait(self) -> None:
        """Return when this request's group is released."""
        now = time.monotonic()
        if self._open is None:
            self._open, self._first = asyncio.Event(), now
            self._releaser = asyncio.get_running_loop().create_task(self._release(self._open))
        self._last = now
        await self._open.wait()

    async def _release(self, group: asyncio.Event) -> None:
        while True:
            until = min(self._last + self.quiet_s, self._first + self.most_s)
            left = until - time.monotonic()
            if left <= 0:
                break
            await asyncio.sleep(left)
        self._open = None
        self.releases += 1
        group.set()


def send_gate() -> SendGate | None:
    """The OpenAI endpoint's gate: ``FTX_OPENAI_GATHER_US`` microseconds of quiet (default
    :data:`DEFAULT_GATHER_US`, at most :data:`MOST_S`; 0: none, each request is sent as soon as it is prepared)."""
    quiet_us = env_int(GATHER_ENV, DEFAULT_GATHER_US, 0, int(MOST_S * 1e6))
    return SendGate(quiet_us / 1e6) if quiet_us else None


__all__ = ["DEFAULT_GATHER_US", "GATHER_ENV", "MOST_S", "SendGate", "send_gate"]
