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
back, the gate waits for that round's clients to send again (as many requests as it let through since its last
release; ``window_s`` at most, for clients that do not come back), then lets every waiting request go at once:
they reach the model's queue together and the next batch holds every client. A client later than that waits for
the next round instead of becoming a batch of its own. A held request waits at most ``most_s`` (an answer that
never comes cannot hold the front's requests longer than that).

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
from ftx_triton.repository.io import FT_MODEL_NAME

WINDOW_ENV = "FTX_FRONT_GATE_US"
"""The gate's window in microseconds; 0, the default, means no gate. Opt-in: on the CPU reproducer it re-merged some
closed loops and fragmented others (docs/benchmarks.md, issue 38); the model's batch delay is the value to try."""
MOST_S = 60.0
"""The longest a request is held (a backstop: an answer that never comes releases everyone after this)."""
_WHOLE = re.compile(r"/v2/models/([^/]+)(?:/versions/[^/]+)?/(?:infer|generate)")


class ModelGate:
    """Holds requests for a busy model until its answers are back, then releases them together (one event loop)."""

    def __init__(self, window_s: float, most_s: float = MOST_S) -> None:
        self.window_s, self.most_s = window_s, most_s
        self.in_flight = 0
        self.held = 0
        self.releases = 0
        """Times held requests were released because the model's answers were back (tests read it)."""
        self._open_until = 0.0
        self._waiters: list[asyncio.Future[None]] = []
        self._arrived = asyncio.Event()
        self._settling: asyncio.Task[None] | None = None
        self._round = 0
        """Requests that went to the model since the last release: the clients whose next requests are awaited."""
        self._waiting_at_answer: int | None = None
        """Requests already held when this round's first answer came (they are not its clients')."""

    @contextlib.asynccontextmanager
    async def passage(self) -> AsyncIterator[None]:
        """Enter when the gate lets this request through; leaving (the model's answer arrived, or it failed) may
        release the held ones."""
        await self._enter()
        self.in_flight += 1
        self._round += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            if self._waiting_at_answer is None:
                self._waiting_at_answer = len(self._waiters)
            if self.in_flight == 0 and self._waiters and self._settling is None:
                self._settling = asyncio.get_running_loop().create_task(self._settle())

    async def _enter(self) -> None:
        now = time.monotonic()
        if self.in_flight == 0 and not self._waiters and self._settling is None and now > self._open_until:
            self._open_until = now + self.window_s  # the model is idle: a batch starts forming
            self._round, self._waiting_at_answer = 0, None
        if now <= self._open_until:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._arrived.set()
        self.held += 1
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.most_s)
        except TimeoutError:
            pass  # the backstop: go anyway
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    async def _settle(self) -> None:
        """The model's answers are back: wait until the round's clients have sent again (as many held requests as
        went to the model since the last release, besides those held before its first answer), ``window_s`` at
        most, then release every held request at once."""
        until = time.monotonic() + self.window_s
        expected = self._round + (self._waiting_at_answer or 0)
        try:
            while len(self._waiters) < expected and (left := until - time.monotonic()) > 0:
                self._arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), left)
        finally:
            self._settling = None
            self.releases += 1
            self._round, self._waiting_at_answer = 0, None
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
    window_us = env_int(WINDOW_ENV, 0, 0, 10_000_000)
    path = repository / FT_MODEL_NAME / "config.pbtxt"
    if not window_us or not path.is_file():  # off (the default): no config is read, nor its parser imported
        return None
    from ftx_triton.repository.model_config import parse_config  # protobuf and tritonclient's gRPC package

    config = parse_config(path)
    delay_us = config.dynamic_batching.max_queue_delay_microseconds if config.HasField("dynamic_batching") else 0
    instances = sum(group.count or 1 for group in config.instance_group) or 1
    if not delay_us or instances != 1:
        return None
    models = [FT_MODEL_NAME]
    for model_dir in sorted(p for p in repository.iterdir() if p.is_dir() and p.name != FT_MODEL_NAME):
        config_path = model_dir / "config.pbtxt"
        if not config_path.is_file():
            continue
        other = parse_config(config_path)
        if other.platform == "ensemble" and any(
            step.model_name == FT_MODEL_NAME for step in other.ensemble_scheduling.step
        ):
            models.append(other.name or model_dir.name)
    return {"models": models, "window_s": window_us / 1e6}


__all__ = ["MOST_S", "WINDOW_ENV", "ModelGate", "gate_spec", "gated_model"]
