"""Token-level metrics of the OpenAI endpoint, in Prometheus' text format on its ``/metrics`` route.

Triton's own metrics (its metrics port) count requests and GPU time per model; what users feel is measured
here, where their requests end. Every series is the endpoint process's, for its one deployment:

============================================  ==========  ================================================
``ftx_time_to_first_token_seconds``           histogram   request sent to the model -> first text out
``ftx_inter_token_latency_seconds``           histogram   per request: (latency - TTFT) / (tokens - 1)
``ftx_request_latency_seconds``               histogram   request sent -> last text out (completed ones)
``ftx_output_tokens_total``                   counter     generated tokens (``rate()`` = output tokens/s)
``ftx_prompt_tokens_total``                   counter     prompt tokens of the requests that completed
``ftx_requests_total{outcome}``               counter     ``ok``, ``error``, ``rejected`` (the model's queue
                                                          refused it: HTTP 429), ``cancelled`` (the client
                                                          left)
``ftx_requests_rejected_total``               counter     the same rejections, as one series to alert on
``ftx_requests_in_flight``                    gauge       generations under way
``ftx_requests_queued``                       gauge       of those, the ones without a first token yet
============================================  ==========  ================================================

A generation's tokens are the model's own ids on the token route, else its text re-tokenized (what
``usage`` counts). ``docs/grafana/ftx-serving.json`` is a dashboard over these series; ``ftx bench --via
openai`` reads them around each level (:mod:`ftx_triton.server.front_metrics`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable, Iterable
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ftx_triton.openai_api.admission import ADVICE, RetryAdvice

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1.0)
LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)


class _Generation(Protocol):
    finish_reason: str

    def astream(self) -> AsyncGenerator[str, None]: ...


class FrontMetrics:
    """The endpoint's series, in a registry of their own (nothing else of the process is exposed)."""

    def __init__(self, advice: RetryAdvice = ADVICE) -> None:
        self.registry = CollectorRegistry()
        self.advice = advice
        r = self.registry
        self.ttft = Histogram(
            "ftx_time_to_first_token_seconds",
            "Request sent to the model -> first text",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "ftx_inter_token_latency_seconds",
            "Per request: (latency - time to first token) / (tokens - 1)",
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "ftx_request_latency_seconds",
            "Request sent -> last text, completed requests",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.output_tokens = Counter("ftx_output_tokens", "Generated tokens", registry=r)
        self.prompt_tokens = Counter("ftx_prompt_tokens", "Prompt tokens of completed requests", registry=r)
        self.requests = Counter("ftx_requests", "Generations by outcome", ["outcome"], registry=r)
        self.rejected = Counter("ftx_requests_rejected", "Requests the model's bounded queue refused (429)", registry=r)
        self.in_flight = Gauge("ftx_requests_in_flight", "Generations under way", registry=r)
        self.queued = Gauge("ftx_requests_queued", "Generations under way without a first token yet", registry=r)
        for outcome in ("ok", "error", "rejected", "cancelled"):
            self.requests.labels(outcome)  # every series exists from the start (a rate of nothing is 0, not absent)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    async def handler(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def track(self, generation: _Generation, count: Callable[[str], int], prompt_tokens: Callable[[], int]) -> Tracked:
        return Tracked(self, generation, count, prompt_tokens)


class Tracked:
    """A generation whose stream is measured: the same ``astream``/``awhole``/``finish_reason``."""

    def __init__(
        self,
        metrics: FrontMetrics,
        generation: _Generation,
        count: Callable[[str], int],
        prompt_tokens: Callable[[], int],
    ) -> None:
        self.metrics, self.generation, self.count, self.prompt_tokens = metrics, generation, count, prompt_tokens

    @property
    def finish_reason(self) -> str:
        return self.generation.finish_reason

    async def astream(self) -> AsyncGenerator[str, None]:
        m = self.metrics
        began = time.perf_counter()
        first: float | None = None
        text: list[str] = []
        outcome = "error"
        m.in_flight.inc()
        m.queued.inc()
        stream = self.generation.astream()
        try:
            async for piece in stream:
                if first is None:
                    first = time.perf_counter()
                    m.queued.dec()
                    m.ttft.observe(first - began)
                text.append(piece)
                yield piece
            outcome = "ok"
        except GeneratorExit:
            outcome = "cancelled"
            raise
        except BaseException as exc:
            outcome = "rejected" if _is_rejection(exc) else "cancelled" if _is_cancel(exc) else "error"
            raise
        finally:
            await stream.aclose()
            ended = time.perf_counter()
            if first is None:
                m.queued.dec()
            m.in_flight.dec()
            m.requests.labels(outcome).inc()
            if outcome == "rejected":
                m.rejected.inc()
            tokens = getattr(self.generation, "tokens", 0) or (self.count("".join(text)) if text else 0)
            m.output_tokens.inc(tokens)
            if outcome == "ok":
                m.latency.observe(ended - began)
                m.advice.completed(ended - began)
                m.prompt_tokens.inc(prompt_token_count([self.generation], self.prompt_tokens))
                if first is not None and tokens > 1:
                    m.itl.observe((ended - first) / (tokens - 1))

    async def awhole(self) -> str:
        return "".join([piece async for piece in self.astream()])


def measured(generation: Any) -> Any:
    """The generation a :class:`Tracked` wrapper measures (or the generation itself)."""
    return generation.generation if isinstance(generation, Tracked) else generation


def prompt_token_count(generations: Iterable[Any], count: Callable[[], int]) -> int:
    """A prompt's tokens for ``usage``: as the token route tokenized the prompt to send it (not encoded a second
    time, which cost the endpoint as much as the first), else ``count()`` (the tokenizer's count)."""
    for generation in generations:
        known = getattr(measured(generation), "prompt_tokens", None)
        if known is not None:
            return int(known)
    return count()


def _is_rejection(exc: BaseException) -> bool:
    from ftx_triton.client.token_stream import Overloaded, is_overload

    return isinstance(exc, Overloaded) or (hasattr(exc, "message") and is_overload(str(getattr(exc, "message", ""))))


def _is_cancel(exc: BaseException) -> bool:
    import asyncio

    return isinstance(exc, asyncio.CancelledError | ConnectionResetError)


__all__ = ["FrontMetrics", "Tracked"]
