"""A batch delay counted from when the model becomes free, in front of Triton's (issue 38).

Triton's dynamic batcher holds a batch's first request ``max_queue_delay_microseconds`` for others, counted from
that request's arrival. Once a closed loop's clients split into two groups (a burst that reached the
``fastertransformer`` model spread over more than the delay), the groups take turns for good: while group B
generates, group A's requests queue; when B ends, A has waited longer than the delay and goes at once, alone, a few
milliseconds before B's clients (whose answers still pass through ``postprocessing``, this front and the client)
send again. Through the ``text`` ensemble that halved the tokens/s of a non-streaming deployment at 32 clients
(docs/benchmarks.md, issue 38).

:class:`ModelGate` counts the delay from when the model becomes free instead. A request bound for the model passes
at once when nothing the gate sent is in flight (a lone client pays nothing), and so does one arriving within
``window_s`` of that (a burst). Later ones wait at the front while the model's batch runs. When the last answer is
back, the gate waits for the batch's clients to send again (until none arrived for ``quiet_s``, ``window_s`` at
most), then lets every waiting request go at once: they reach the model's queue together and the next batch holds
both groups. A late client waits for the next round instead of becoming a batch of its own. A held request waits at
most ``most_s`` (an answer that never comes cannot hold the front's requests longer than that).

Only requests answered in one piece are gated (their answer comes when the model's batch ended; a stream's end
depends on how fast its client reads). :func:`gate_spec` says whether a repository wants the gate: its
``fastertransformer`` model batches dynamically with a delay and one instance (with several, a request the gate
held could have run on an idle instance), and which models' requests reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ftx_triton.envvars import env_int

FT_MODEL = "fastertransformer"
WINDOW_ENV = "FTX_FRONT_GATE_US"
"""The gate's window in microseconds; 0, the default, means no gate. Opt-in: on the CPU reproducer it re-merged some
closed loops and fragmented others (docs/benchmarks.md, issue 38); the model's batch delay is the value to try."""
QUIET_S = 0.005
"""Once the model's answers are back, held requests go when no new one arrived for this long (or ``window_s`` after
the answers at most)."""
MOST_S = 60.0
"""The longest a request is held (a backstop: an answer that never comes releases everyone after this)."""
_WHOLE = re.compile(r"/v2/models/([^/]+)(?:/versions/[^/]+)?/(?:infer|generate)")


class ModelGate:
    """Holds requests for a busy model until its answers are back, then releases them together (one event loop)."""

    def __init__(self, window_s: float, most_s: float = MOST_S, quiet_s: float = QUIET_S) -> None:
        self.window_s, self.most_s, self.quiet_s = window_s, most_s, quiet_s
        self.in_flight = 0
        self.held = 0
        self.releases = 0
        """Times held requests were released because the model's answers were back (tests read it)."""
        self._open_until = 0.0
        self._last_arrival = 0.0
        self._waiters: list[asyncio.Future[None]] = []
        self._settling: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def passage(self) -> AsyncIterator[None]:
        """Enter when the gate lets this request through; leaving (the model's answer arrived, or it failed) may
        release the held ones."""
        await self._enter()
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            if self.in_flight == 0 and self._waiters and self._settling is None:
                self._settling = asyncio.get_running_loop().create_task(self._settle())

    async def _enter(self) -> None:
        now = time.monotonic()
        self._last_arrival = now
        if self.in_flight == 0 and not self._waiters and self._settling is None and now > self._open_until:
            self._open_until = now + self.window_s  # the model is idle: a batch starts forming
        if now <= self._open_until:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self.held += 1
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.most_s)
        except TimeoutError:
            pass  # the backstop: go anyway
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    async def _settle(self) -> None:
        """The model's answers are back: wait until its clients' next requests stop arriving (``quiet_s`` without
        one, ``window_s`` at most), then release every held request at once."""
        free = time.monotonic()
        try:
            while True:
                until = min(max(self._last_arrival, free) + self.quiet_s, free + self.window_s)
                left = until - time.monotonic()
                if left <= 0:
                    break
                await asyncio.sleep(left)
        finally:
            self._settling = None
            self.releases += 1
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)


def gated_model(path: str, models: frozenset[str]) -> bool:
    """Whether a request to ``path`` (the forwarded, checked path) is answered in one piece by a model of
    ``models``."""
    found = _WHOLE.fullmatch(path)
    return found is not None and found.group(1) in models


def gate_spec(repository: Path) -> dict[str, Any] | None:
    """``{"models": [...], "window_s": s}`` for a repository whose ``fastertransformer`` model batches dynamically
    with a delay on one instance (the models whose requests reach it: itself and the ensembles that call it), or
    None: no gate."""
    from ftx_triton.repository.model_config import parse_config

    path = repository / FT_MODEL / "config.pbtxt"
    if not path.is_file():
        return None
    config = parse_config(path)
    delay_us = config.dynamic_batching.max_queue_delay_microseconds if config.HasField("dynamic_batching") else 0
    instances = sum(group.count or 1 for group in config.instance_group) or 1
    window_us = env_int(WINDOW_ENV, 0, 0, 10_000_000)
    if not delay_us or instances != 1 or not window_us:
        return None
    models = [FT_MODEL]
    for model_dir in sorted(p for p in repository.iterdir() if p.is_dir() and p.name != FT_MODEL):
        config_path = model_dir / "config.pbtxt"
        if not config_path.is_file():
            continue
        other = parse_config(config_path)
        if other.platform == "ensemble" and any(step.model_name == FT_MODEL for step in other.ensemble_scheduling.step):
            models.append(other.name or model_dir.name)
    return {"models": models, "window_s": window_us / 1e6}


__all__ = ["MOST_S", "WINDOW_ENV", "ModelGate", "gate_spec", "gated_model"]
