"""The closed-loop load generator of ``ftx bench`` and ``benchmarks/``: ``c`` clients, each sending requests back
to back through one pluggable sender (Triton's generate extension or the OpenAI endpoint's streamed completions)."""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ftx_triton.client.text_client import HttpError, HttpTriton, sse_data, text_interface
from ftx_triton.errors import ToolError

Sender = Callable[[], str]
"""Sends one request and returns its text (starting with the prompt)."""


@dataclass(frozen=True)
class Point:
    """One concurrency level's figures."""

    concurrency: int
    requests: int
    throughput_rps: float
    latency_p50_ms: float
    latency_p90_ms: float
    latency_p99_ms: float
    latency_avg_ms: float
    tokens_per_s: float | None = None
    front: dict[str, Any] | None = None
    """What the OpenAI endpoint's own metrics said over the level (``--via openai``: mean TTFT and ITL, output
    tokens/s, completed, rejected and failed requests; ``ftx_triton.server.front_metrics.level_figures``)."""


class LevelWatch(Protocol):
    """Told when each concurrency level begins and ends; what it returns at the end is the level's ``front``."""

    def begin(self) -> None: ...

    def end(self, seconds: float) -> dict[str, Any]: ...


class Rejected(Exception):
    """A request the deployment's bounded queue refused (HTTP 429): the load goes on."""


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def _warmed(send: Sender, what: str, refused: tuple[type[BaseException], ...]) -> Sender:
    """``send`` after one warm-up request, which also finds out whether the server takes this request at all."""
    try:
        send()
    except refused as exc:
        raise ToolError(
            f"{what} refused the benchmark's request: {getattr(exc, 'message', exc)}",
            hint="choose a --prompt and --max-tokens the model accepts (try them with `ftx generate`)",
        ) from None
    return send


def triton_sender(url: str, model: str, prompt: str, max_tokens: int) -> Sender:
    """Requests over Triton's generate extension at ``url`` (streamed when the model is decoupled), warmed up."""
    server = HttpTriton(url)
    iface = text_interface(server, model)
    values = {"prompt": prompt, "max_tokens": max_tokens, **({"stream": True} if iface.decoupled else {})}

    def send() -> str:
        return server.generate(iface, values) if not iface.decoupled else "".join(server.generate_stream(iface, values))

    return _warmed(send, "the server", (HttpError,))


def openai_sender(base: str, model: str, prompt: str, max_tokens: int) -> Sender:
    """Streamed completions through the OpenAI endpoint (``base`` = ``http://host:port/v1``), warmed up; a 429
    (the bounded queue is full) raises :class:`Rejected`."""
    import urllib.error
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True}).encode()

    def send() -> str:
        request = urllib.request.Request(
            base.rstrip("/") + "/completions", data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with opener.open(request, timeout=600) as response:
                text = []
                for raw in response:
                    data = sse_data(raw)
                    if data is not None and data != "[DONE]":
                        event = json.loads(data)
                        if "error" in event:
                            raise ToolError(f"the stream sent an error: {event['error']}")
                        text.append(str(event["choices"][0].get("text", "")))
                return prompt + "".join(text)
        except urllib.error.HTTPError as exc:
            if exc.code == 429:
                raise Rejected from None
            raise ToolError(f"the OpenAI endpoint answered {exc.code}: {exc.read()[:300]!r}") from None

    return _warmed(send, "the OpenAI endpoint", (ToolError, OSError))


def closed_loop(
    send: Sender,
    concurrency: Sequence[int],
    requests: int,
    count_tokens: Callable[[str], int] | None,
    prompt: str,
    watch: LevelWatch | None = None,
) -> list[Point]:
    """``c`` clients each calling ``send()`` (-> the text, starting with the prompt) back to back until
    ``requests`` are done, per level; ``watch`` adds what it measured over each level."""
    points = []
    for c in concurrency:
        if watch is not None:
            watch.begin()
        began = time.perf_counter()
        point = _level(send, c, requests, count_tokens, prompt)
        if watch is not None:
            point = Point(**{**point.__dict__, "front": watch.end(time.perf_counter() - began)})
        points.append(point)
    return points


def _level(send: Sender, c: int, requests: int, count_tokens: Callable[[str], int] | None, prompt: str) -> Point:
    """One concurrency level: ``c`` threads sharing ``requests`` requests."""
    latencies: list[float] = []
    tokens: list[int] = []
    lock = threading.Lock()
    left = [requests]
    errors: list[BaseException] = []

    def client() -> None:
        while True:
            with lock:
                if left[0] <= 0 or errors:
                    return
                left[0] -= 1
            began = time.perf_counter()
            try:
                text = send()
            except Rejected:  # the bounded queue refused it: counted by the endpoint's metrics, not a fault
                continue
            except BaseException as exc:  # noqa: BLE001 - reported after the threads stop
                with lock:
                    errors.append(exc)
                return
            took = time.perf_counter() - began
            with lock:
                latencies.append(took)
                if count_tokens is not None:
                    tokens.append(count_tokens(text.removeprefix(prompt)))

    started = time.perf_counter()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(c)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    if errors:
        raise ToolError(f"a benchmark request failed: {errors[0]}", hint="check the server with `ftx ps`")
    ms = [x * 1000 for x in latencies]
    return Point(
        c,
        len(ms),
        len(ms) / wall,
        _percentile(ms, 50),
        _percentile(ms, 90),
        _percentile(ms, 99),
        statistics.fmean(ms),
        sum(tokens) / wall if tokens else None,
    )


__all__ = ["LevelWatch", "Point", "Rejected", "Sender", "closed_loop", "openai_sender", "triton_sender"]
