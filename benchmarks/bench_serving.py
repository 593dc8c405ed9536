#!/usr/bin/env python
"""Serving under load: a running ftx deployment measured the way users call it.

Three paths, at each concurrency level (default 1, 8, 32, 64):

* ``text``: Triton's generate extension on the ``text`` ensemble (``/generate_stream`` when the model is
  decoupled, i.e. deployed with ``--streaming``; ``/generate`` otherwise);
* ``openai``: the OpenAI-compatible endpoint ``ftx run`` starts beside Triton, ``/v1/completions`` with
  ``stream: true``;
* ``raw``: the ``fastertransformer`` model alone, one request holding a batch of as many random
  prompts as there are clients (same prompt length in tokens, ``end_id`` outside the vocabulary so
  every row generates exactly ``--max-tokens``, each answer checked by ``bench_native_ft``'s
  ``generated_tokens``): the throughput the model reaches when the batch is formed for it, against
  which the two user paths are compared (``vs raw`` = their tokens/s over the raw model's at batch = the
  concurrency).

* ``raw-loop``: the ``fastertransformer`` model alone as users reach it, one random prompt per request from
  ``c`` closed-loop clients, through the same dynamic batcher (the ceiling the user paths can reach with
  FasterTransformer's whole-batch generation; ``vs loop`` = their tokens/s over it).

* ``raw-route``: the raw loop with every input the OpenAI endpoint's token route sends beside its ids (the
  sampling settings, a seed, ``is_return_log_probs``, the word lists, ``output_log_probs`` asked for): what those
  inputs cost the model, apart from what the endpoint itself costs (``openai`` against ``raw-route``).

``text``, ``openai`` and ``raw-loop`` are closed loops: ``c`` clients, each sending its next request as soon as its
previous one ended, until a FIXED number of requests per level is done (``--requests``, default 4 per
client and at least 8): never "until stable", so a busy machine slows the figures but cannot make the run
give up or last forever. Per level: requests/s and generated tokens/s (over the level's wall time), time
to first token (TTFT: the first event holding text), inter-token latency (ITL: per request,
``(latency - TTFT) / (tokens - 1)``, the definition genai-perf uses, which does not depend on how many
tokens the server packs into one event), each as p50/p90 over the requests. Generated tokens are counted
by re-tokenizing each answer's new text with the deployment's own tokenizer (the repository's
``preprocessing/1``, as the OpenAI endpoint counts ``usage``); the table says how many requests ended
short of ``--max-tokens`` (an end-of-text token or a stop). A model that does not stream answers in one
event: its TTFT is its latency and ITL is not measured.

``--rates 2,4,8`` adds open-loop levels: requests arrive as a Poisson process at each rate (requests/s,
exponential gaps drawn from a fixed seed), each sent whether or not earlier ones ended, as vLLM's and
genai-perf's serving benchmarks do; a closed loop hides queueing, since its clients wait. Every level reports
goodput: requests/s that met both ``--slo-ttft-ms`` and ``--slo-itl-ms`` (a non-streaming answer has no ITL:
its TTFT, the latency, must meet the TTFT target alone).

The load generator is hand-written on asyncio + aiohttp (a dependency of ftx already): the
perf_analyzer ftx installs (tritonclient 2.41's) has no OpenAI service kind and counts no tokens,
genai-perf does not install on the GPU hosts (no network, its dependencies absent), and one event loop
holds 64 streaming clients without 64 threads whose scheduling would add to the latencies measured.

Against a deployment started with ``ftx run MODEL --streaming --detach`` (found like ``ftx bench`` finds
it: the one running under FTX_HOME, or NAME from ``ftx ps``, or ``--url``)::

    python benchmarks/bench_serving.py --json serving.json
    python benchmarks/bench_serving.py tiny-gptj --concurrency 1,2 --requests 4 --max-tokens 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).parent))

from bench_native_ft import MeasurementFault, end_id_for, generated_tokens, infer, random_request  # noqa: E402

DEFAULT_PROMPT = (
    "The history of computing is a story of machines that became smaller, faster and cheaper, "
    "while the problems people asked of them grew larger every year. Early computers filled rooms"
)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the deployment


@dataclass(frozen=True)
class Target:
    """What is measured: Triton's HTTP and gRPC addresses (``host:port``), the OpenAI base URL
    (``http://host:port/v1``, empty without one) and the repository served (for its tokenizer)."""

    http: str
    grpc: str
    openai: str
    repository: Path
    model: str
    pid: int = 0
    """The process ftx recorded for the tritonserver (its supervisor when it has one): the soak reads its memory."""


def find_target(name: str | None, url: str | None) -> Target:
    """The running deployment of this FTX_HOME, chosen as ``ftx bench`` chooses (NAME, --url or the only one)."""
    from ftx_triton.cli.bench import _target

    served = _target(name, url)
    return Target(served.http, served.grpc, served.openai, Path(served.repository), served.model, served.pid)


class Tokens:
    """Counts generated tokens the way the deployment does: its own tokenizer, re-encoding text."""

    def __init__(self, repository: Path) -> None:
        from ftx_triton.repository.textproc import load_codec

        self.codec = load_codec(repository / "preprocessing" / "1")

    def generated(self, text: str) -> int:
        return len(self.codec.encode(text, prompt=False))

    def prompt(self, text: str) -> int:
        return len(self.codec.encode(text, prompt=True))


def model_vocab(http: str, timeout_s: float = 30.0) -> int:
    """The raw model's vocabulary size: ``vocab_size`` of the checkpoint the fastertransformer model loads
    (FasterTransformer's ``config.ini``, or the Hugging Face ``config.json`` the python runtime serves)."""
    import configparser

    from ftx_triton.client.text_client import HttpTriton

    config = HttpTriton(http, timeout_s).get_model_config("fastertransformer")["config"]
    path = Path(config.get("parameters", {}).get("model_checkpoint_path", {}).get("string_value", ""))
    ini = configparser.ConfigParser()
    if (path / "config.ini").is_file():
        ini.read(path / "config.ini")
        for section in ini.sections():
            if ini.has_option(section, "vocab_size"):
                return ini.getint(section, "vocab_size")
    if (path / "config.json").is_file():
        return int(json.loads((path / "config.json").read_text())["vocab_size"])
    raise SystemExit(
        f"error: cannot find the raw model's vocab_size under {path} (config.ini or config.json)\n"
        "hint: pass it with --vocab N, or leave the raw model out: --paths text,openai"
    )


# --------------------------------------------------------------------------- one request


@dataclass
class Sample:
    """One request as the client saw it: seconds from its start to the first text and to its end."""

    ttft_s: float
    latency_s: float
    tokens: int
    events: int
    finish: str = ""
    """Why the server says it stopped (OpenAI's ``finish_reason``: ``length`` or ``stop``); empty when unsaid."""


async def _sse(response: aiohttp.ClientResponse) -> Any:
    """The JSON events of a server-sent event stream (``data: {...}``), up to ``data: [DONE]``."""
    from ftx_triton.client.text_client import sse_data

    async for raw in response.content:
        data = sse_data(raw)
        if data is None:
            continue  # blank separators and ': comment' lines
        if data == "[DONE]":
            return
        event = json.loads(data)
        if isinstance(event, dict) and "error" in event:
            raise RuntimeError(f"the stream sent an error: {event['error']}")
        yield event


async def _failed(response: aiohttp.ClientResponse) -> None:
    """A RuntimeError with the server's own message (Triton's, or OpenAI's error shape) unless HTTP 200."""
    if response.status == 200:
        return
    text = (await response.text()).strip().removeprefix("data:")  # a stream frames its error as an event
    try:
        error = json.loads(text)["error"]
        text = str(error.get("message", error) if isinstance(error, dict) else error)
    except (ValueError, KeyError, TypeError):
        pass
    raise RuntimeError(f"HTTP {response.status}: {text[:300]}")


class TextPath:
    """The ``text`` ensemble over Triton's generate extension (streamed when the model is decoupled)."""

    name = "text"

    def __init__(self, http: str, prompt: str, max_tokens: int, tokens: Tokens) -> None:
        from ftx_triton.client.text_client import HttpTriton, text_interface
        from ftx_triton.repository.io import TEXT_MODEL_NAME

        self.iface = text_interface(HttpTriton(http), TEXT_MODEL_NAME)
        self.streams = self.iface.decoupled
        values: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens}
        if self.streams:
            values["stream"] = True
        self.body = self.iface.payload(values)
        route = "generate_stream" if self.streams else "generate"
        self.url = f"http://{http}/v2/models/{TEXT_MODEL_NAME}/{route}"
        self.prompt, self.tokens = prompt, tokens

    async def __call__(self, session: aiohttp.ClientSession) -> Sample:
        from ftx_triton.client.text_client import pieces

        started = time.perf_counter()
        first, texts = None, []
        async with session.post(self.url, json=self.body) as response:
            await _failed(response)
            if self.streams:
                async for event in _sse(response):
                    text = str(event.get(self.iface.output, ""))
                    if text and first is None:
                        first = time.perf_counter()
                    texts.append(text)
            else:
                texts.append(str((await response.json()).get(self.iface.output, "")))
        ended = time.perf_counter()
        whole = "".join(pieces(iter(texts), self.iface, self.prompt))  # a decoder's text starts with the prompt
        new = whole.removeprefix(self.prompt) if self.iface.continues_prompt else whole
        return Sample((first or ended) - started, ended - started, self.tokens.generated(new), len(texts))


class OpenAIPath:
    """``/v1/completions`` with ``stream: true`` on the OpenAI-compatible endpoint."""

    name = "openai"

    def __init__(self, base: str, prompt: str, max_tokens: int, tokens: Tokens, model: str) -> None:
        self.url = base.rstrip("/") + "/completions"
        self.body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True}
        self.tokens = tokens
        self.streams = True  # set from the answer's X-Ftx-Stream header on the first request
        self.route = "ensemble"
        """``tokens`` when the endpoint reads the raw model's ids itself (X-Ftx-Route): then no text model runs."""

    async def __call__(self, session: aiohttp.ClientSession) -> Sample:
        started = time.perf_counter()
        first, texts, finish = None, [], ""
        async with session.post(self.url, json=self.body) as response:
            await _failed(response)
            self.streams = response.headers.get("X-Ftx-Stream", "tokens") == "tokens"
            self.route = response.headers.get("X-Ftx-Route", "ensemble")
            async for event in _sse(response):
                choice = event["choices"][0]
                text = str(choice.get("text", ""))
                if text and first is None:
                    first = time.perf_counter()
                texts.append(text)
                finish = str(choice.get("finish_reason") or finish)
        ended = time.perf_counter()
        generated = self.tokens.generated("".join(texts))
        return Sample((first or ended) - started, ended - started, generated, len(texts), finish)


async def openai_model_id(base: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(base.rstrip("/") + "/models") as response:
        await _failed(response)
        return str((await response.json())["data"][0]["id"])


class RawLoopPath:
    """One random prompt per request straight to ``fastertransformer`` over gRPC (its stream when decoupled),
    every answer checked to hold exactly ``max_tokens`` new ids (``bench_native_ft.generated_tokens``)."""

    name = "raw-loop"

    def __init__(self, target: Target, prompt_len: int, max_tokens: int, vocab: int, decoupled: bool) -> None:
        from ftx_triton.client.token_stream import AsyncTokenClient

        self.client = AsyncTokenClient(target.grpc)
        self.prompt_len, self.max_tokens, self.vocab = prompt_len, max_tokens, vocab
        self.streams = decoupled
        self.seed = 1000

    async def __call__(self, _session: aiohttp.ClientSession) -> Sample:
        from ftx_triton.client.token_stream import read_response

        self.seed += 1
        columns = random_request(1, self.prompt_len, self.max_tokens, self.vocab, self.seed)
        request = self.request(columns)
        started = time.perf_counter()
        first, events, last = None, 0, None
        if self.streams:
            done = asyncio.Event()

            async def requests() -> Any:
                yield request
                await done.wait()

            call = self.client.stub().ModelStreamInfer(requests())
            try:
                async for message in call:
                    outputs, final = read_response(message)
                    if outputs:
                        events += 1
                        last = outputs
                        if first is None and int(outputs["sequence_length"].reshape(-1)[0]) > self.prompt_len:
                            first = time.perf_counter()
                    if final:
                        break
            finally:
                done.set()
                call.cancel()
        else:
            from tritonclient.grpc import service_pb2

            del request.parameters["triton_enable_empty_final_response"]
            answer = await self.client.stub().ModelInfer(request)
            last, _final = read_response(service_pb2.ModelStreamInferResponse(infer_response=answer))
            events = 1
        ended = time.perf_counter()
        if last is None:
            raise RuntimeError("the raw model answered nothing")
        try:
            tokens = generated_tokens(
                columns["input_ids"],
                last["output_ids"],
                last["sequence_length"],
                self.max_tokens,
                end_id_for(self.vocab),
                self.vocab,
            )
        except MeasurementFault as fault:
            raise ValueError(f"the raw answer failed its check: {fault}") from None
        return Sample((first or ended) - started, ended - started, tokens, events)

    def request(self, columns: dict[str, Any]) -> Any:
        from ftx_triton.client.token_stream import infer_request

        return infer_request(columns)


class RawRoutePath(RawLoopPath):
    """The raw loop with the other inputs the OpenAI endpoint's token route sends (its own preprocessing code's
    for a plain request of ``prompt`` and ``max_tokens``), and the outputs it asks for: the model's cost of those
    inputs."""

    name = "raw-route"

    def __init__(  # noqa: PLR0913 - the raw loop's arguments and the run's prompt
        self,
        target: Target,
        prompt_len: int,
        max_tokens: int,
        vocab: int,
        decoupled: bool,
        prompt: str = DEFAULT_PROMPT,
    ) -> None:
        from ftx_triton.client.token_stream import TokenRoute

        super().__init__(target, prompt_len, max_tokens, vocab, decoupled)
        route = TokenRoute(target.repository)
        # the run's own prompt: one the deployment's tokenizer reads (a character tokenizer may know no "Hello")
        tensors, _prompt = route.inputs({"prompt": prompt, "max_tokens": max_tokens})
        own = random_request(1, 1, max_tokens, vocab, 0)
        self.extra = {name: array for name, array in tensors.items() if name not in own}
        self.outputs = route.whole_outputs()

    def request(self, columns: dict[str, Any]) -> Any:
        from ftx_triton.client.token_stream import infer_request

        return infer_request({**columns, **self.extra}, outputs=self.outputs)


# --------------------------------------------------------------------------- Triton's own statistics

STEP_MODELS = ("preprocessing", "fastertransformer", "postprocessing")


Counts = dict[str, dict[str, int]]
"""Per model: Triton's cumulative counters, and ``batch:N`` the executions of N rows (its ``batch_stats``)."""


def triton_counters(http: str) -> Counts:
    """Triton's cumulative statistics of the models a text request runs through (``/v2/models/stats``)."""
    from ftx_triton.client.text_client import HttpTriton

    out = {}
    for model in HttpTriton(http).get_json("/v2/models/stats").get("model_stats", ()):
        if model.get("name") not in STEP_MODELS:
            continue
        stats = model.get("inference_stats", {})
        out[model["name"]] = {
            "inferences": int(model.get("inference_count", 0)),
            "executions": int(model.get("execution_count", 0)),
            "requests": int(stats.get("success", {}).get("count", 0)),
            "queue_ns": int(stats.get("queue", {}).get("ns", 0)),
            "compute_ns": sum(
                int(stats.get(k, {}).get("ns", 0)) for k in ("compute_input", "compute_infer", "compute_output")
            ),
        }
        for batch in model.get("batch_stats", ()):
            size = int(batch.get("batch_size", 0))
            out[model["name"]][f"batch:{size}"] = int(batch.get("compute_infer", {}).get("count", 0))
    return out


def model_costs(before: Counts, after: Counts) -> dict[str, dict[str, Any]]:
    """What each model did between two readings: requests, executions, mean batch per execution, the
    executions of each batch size (rows: ``{size: executions}``; a mean hides a closed loop's clients splitting
    into a lone request and all the others), mean queue and compute milliseconds per request (where time goes: a
    model whose queue time grows with the concurrency wants more instances or dynamic batching)."""
    costs = {}
    for name, now in sorted(after.items(), key=lambda item: STEP_MODELS.index(item[0])):
        was = before.get(name, dict.fromkeys(now, 0))
        d = {k: now[k] - was.get(k, 0) for k in now}
        if not d["requests"]:
            continue
        costs[name] = {
            "requests": d["requests"],
            "executions": d["executions"],
            "mean_batch": d["inferences"] / d["executions"] if d["executions"] else 0.0,
            "batches": dict(sorted((int(k[len("batch:") :]), n) for k, n in d.items() if k.startswith("batch:") and n)),
            "queue_ms": d["queue_ns"] / d["requests"] / 1e6,
            "compute_ms": d["compute_ns"] / d["requests"] / 1e6,
        }
    return costs


class Counters:
    """Triton's statistics, read once Triton counted every request the benchmark sent.

    Triton updates a decoupled model's statistics after its last response left, so a reading taken as the
    client got its last event can miss that request, and the next level's reading would count it. The
    benchmark therefore tells this object what it sent (:meth:`sent`) and a reading waits (5 s at most)
    until the counters hold all of it; once a wait ran out (a backend that counts differently), readings
    stop waiting."""

    def __init__(self, http: str) -> None:
        self.http = http
        self.start = triton_counters(http)
        self.expected = dict.fromkeys(STEP_MODELS[:2], 0)
        self.tries = 50

    def sent(self, *, text: int = 0, raw: int = 0) -> None:
        """``text`` requests through the ensemble (each runs preprocessing and the raw model), ``raw`` to
        the raw model alone."""
        self.expected["preprocessing"] += text
        self.expected["fastertransformer"] += text + raw

    async def read(self) -> dict[str, dict[str, int]]:
        for _ in range(self.tries):
            now = triton_counters(self.http)
            counted = model_costs(self.start, now)
            if all(counted.get(m, {}).get("requests", 0) >= n for m, n in self.expected.items()):
                return now
            await asyncio.sleep(0.1)
        self.tries = 1
        return triton_counters(self.http)


# --------------------------------------------------------------------------- a level


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile, linear between the closest ranks (statistics' "inclusive" method)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


@dataclass
class Level:
    """One path at one concurrency: what was sent, what came back, the figures."""

    path: str
    concurrency: int
    requests: int
    rate: float | None = None
    """Open loop: the Poisson arrival rate (requests/s); None for a closed loop of ``concurrency`` clients."""
    errors: int = 0
    first_error: str = ""
    wall_s: float = 0.0
    tokens: int = 0
    short: int = 0
    """Requests that ended with fewer than --max-tokens tokens (counted by re-tokenizing)."""
    garbled: int = 0
    """Requests whose text holds more than --max-tokens tokens: pieces out of order or sent twice (a stream of
    whole-text answers read out of order repeats its text); counted as --max-tokens in the figures."""
    requests_per_s: float = 0.0
    tokens_per_s: float = 0.0
    ttft_p50_ms: float = 0.0
    ttft_p90_ms: float = 0.0
    itl_p50_ms: float | None = None
    itl_p90_ms: float | None = None
    latency_p50_ms: float = 0.0
    latency_p90_ms: float = 0.0
    raw_tokens_per_s: float | None = None
    vs_raw: float | None = None
    goodput_rps: float = 0.0
    """Requests/s that met the TTFT and ITL targets (``--slo-ttft-ms``, ``--slo-itl-ms``)."""
    vs_loop: float | None = None
    """tokens/s over the closed-loop raw baseline's (``raw-loop``) at the same level."""
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Triton's statistics of each step model over the level (:func:`model_costs`)."""
    samples: list[Sample] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict[str, Any]:
        """The figures, and every request's seconds to its first text and to its end, and its tokens."""
        return asdict(self)


async def closed_loop(
    call: Callable[[aiohttp.ClientSession], Awaitable[Sample]], concurrency: int, requests: int, timeout_s: float
) -> tuple[list[Sample], list[str], float]:
    """``concurrency`` clients sending back to back until ``requests`` are done: (samples, errors, wall s)."""
    tickets = iter(range(requests))  # one event loop: the clients share the iterator without a lock
    samples: list[Sample] = []
    errors: list[str] = []
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:

        async def client() -> None:
            for _ in tickets:
                try:
                    samples.append(await call(session))
                except (TimeoutError, aiohttp.ClientError, RuntimeError, ValueError) as exc:
                    errors.append(f"{type(exc).__name__}: {exc}"[:300])

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return samples, errors, time.perf_counter() - started


async def open_loop(
    call: Callable[[aiohttp.ClientSession], Awaitable[Sample]], rate: float, requests: int, timeout_s: float, seed: int
) -> tuple[list[Sample], list[str], float]:
    """``requests`` requests arriving as a Poisson process of ``rate`` per second, each sent at its time whatever
    the earlier ones do: (samples, errors, wall s from the first arrival to the last answer)."""
    import random

    gaps = random.Random(seed)
    samples: list[Sample] = []
    errors: list[str] = []
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:

        async def one() -> None:
            try:
                samples.append(await call(session))
            except (TimeoutError, aiohttp.ClientError, RuntimeError, ValueError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}"[:300])

        started = time.perf_counter()
        tasks = []
        for i in range(requests):
            if i:
                await asyncio.sleep(gaps.expovariate(rate))
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
        return samples, errors, time.perf_counter() - started


def meets(sample: Sample, ttft_ms: float, itl_ms: float, streams: bool) -> bool:
    """Whether one request met the targets (without a stream, its latency is its TTFT and it has no ITL)."""
    if sample.ttft_s * 1000 > ttft_ms:
        return False
    if not streams or sample.tokens <= 1:
        return True
    return (sample.latency_s - sample.ttft_s) * 1000 / (sample.tokens - 1) <= itl_ms


def summarize(
    level: Level,
    samples: list[Sample],
    errors: list[str],
    wall: float,
    max_tokens: int,
    streams: bool,
    slo: tuple[float, float] = (float("inf"), float("inf")),
) -> None:
    level.samples, level.wall_s = samples, wall
    level.errors, level.first_error = len(errors), errors[0] if errors else ""
    if not samples:
        return
    level.tokens = sum(min(s.tokens, max_tokens) for s in samples)  # no request generates more than it asked
    level.short = sum(s.tokens < max_tokens for s in samples)
    level.garbled = sum(s.tokens > max_tokens for s in samples)
    level.requests_per_s = len(samples) / wall
    level.tokens_per_s = level.tokens / wall
    level.goodput_rps = sum(meets(s, *slo, streams) for s in samples) / wall
    ttft = [s.ttft_s * 1000 for s in samples]
    latency = [s.latency_s * 1000 for s in samples]
    level.ttft_p50_ms, level.ttft_p90_ms = percentile(ttft, 50), percentile(ttft, 90)
    level.latency_p50_ms, level.latency_p90_ms = percentile(latency, 50), percentile(latency, 90)
    itl = [(s.latency_s - s.ttft_s) * 1000 / (s.tokens - 1) for s in samples if s.tokens > 1]
    if streams and itl:
        level.itl_p50_ms, level.itl_p90_ms = percentile(itl, 50), percentile(itl, 90)


# --------------------------------------------------------------------------- the raw model


class RawModel:
    """The ``fastertransformer`` model at batch = concurrency: median tokens/s of ``repeats`` requests."""

    def __init__(self, target: Target, prompt_len: int, max_tokens: int, repeats: int, vocab: int = 0) -> None:
        from ftx_triton.client.text_client import HttpTriton

        config = HttpTriton(target.http).get_model_config("fastertransformer")["config"]
        if "input_lengths" not in {i.get("name") for i in config.get("input", ())}:
            raise SystemExit(
                "error: the raw path sends a decoder's inputs; this fastertransformer model is an "
                "encoder-decoder\nhint: leave raw out: --paths text,openai"
            )
        self.max_batch = int(config.get("max_batch_size", 0))
        self.decoupled = bool((config.get("model_transaction_policy") or {}).get("decoupled"))
        self.vocab = vocab or model_vocab(target.http)
        self.target, self.prompt_len, self.max_tokens, self.repeats = target, prompt_len, max_tokens, repeats
        self.refused: dict[int, str] = {}
        self.sent = 0
        """Requests of the last :meth:`tokens_per_s` that the model answered."""
        """batch -> why its figure was refused (an answer short of its tokens, or over max_batch_size)."""

    def once(self, batch: int, seed: int) -> tuple[float, int]:
        if not self.decoupled:
            seconds, tokens, _ = infer(self.target.http, batch, self.prompt_len, self.max_tokens, self.vocab, seed)
            return seconds, tokens
        return self._streamed(batch, seed)

    def _streamed(self, batch: int, seed: int) -> tuple[float, int]:
        """A decoupled model answers over gRPC's stream only; its last response holds every id."""
        import queue

        import tritonclient.grpc as grpcclient

        columns = random_request(batch, self.prompt_len, self.max_tokens, self.vocab, seed)
        tensors = []
        for name, value in columns.items():
            tensor = grpcclient.InferInput(name, list(value.shape), "UINT32")
            tensor.set_data_from_numpy(value)
            tensors.append(tensor)
        wanted = ("output_ids", "sequence_length")
        answers: queue.Queue[Any] = queue.Queue()
        client = grpcclient.InferenceServerClient(self.target.grpc)
        last: dict[str, Any] = {}
        try:
            client.start_stream(callback=lambda result, error: answers.put((result, error)))
            started = time.perf_counter()
            client.async_stream_infer(
                "fastertransformer",
                tensors,
                outputs=[grpcclient.InferRequestedOutput(n) for n in wanted],
                enable_empty_final_response=True,
            )
            while True:
                result, error = answers.get(timeout=600)
                if error is not None:
                    raise RuntimeError(str(error))
                got = {n: result.as_numpy(n) for n in wanted if result.as_numpy(n) is not None}
                last = got or last
                if result.get_response().parameters["triton_final_response"].bool_param:
                    break
            seconds = time.perf_counter() - started
        finally:
            client.stop_stream()
            client.close()
        return seconds, generated_tokens(
            columns["input_ids"],
            last["output_ids"],
            last["sequence_length"],
            self.max_tokens,
            end_id_for(self.vocab),
            self.vocab,
        )

    def tokens_per_s(self, batch: int) -> float | None:
        self.sent = 0
        if self.max_batch and batch > self.max_batch:
            self.refused[batch] = f"over the model's max_batch_size {self.max_batch}"
            say(f"bench     raw batch {batch}: {self.refused[batch]}, not measured")
            return None
        rates = []
        try:
            self.sent += 1
            self.once(batch, seed=99)  # warm-up
            for r in range(self.repeats):
                self.sent += 1
                seconds, tokens = self.once(batch, seed=r)
                rates.append(tokens / seconds)
        except MeasurementFault as fault:  # an answer short of its tokens: no figure rather than a false one
            self.refused[batch] = str(fault)
            say(f"bench     raw batch {batch}: REFUSED {fault}")
            return None
        return statistics.median(rates)


# --------------------------------------------------------------------------- the run


def machine() -> dict[str, Any]:
    """CPU, cores and GPUs (nvidia-smi, when there is one) of the machine running the benchmark."""
    import shutil
    import subprocess

    gpus: list[str] = []
    if shutil.which("nvidia-smi"):
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, check=False
        )
        gpus = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "gpus": gpus,
        "load_average_1min": round(os.getloadavg()[0], 2),  # at the start: how busy the machine already was
    }


async def run(args: argparse.Namespace, target: Target) -> dict[str, Any]:
    tokens = Tokens(target.repository)
    prompt_len = tokens.prompt(args.prompt)
    paths: list[Any] = []
    if "text" in args.paths:
        paths.append(TextPath(target.http, args.prompt, args.max_tokens, tokens))
    if "openai" in args.paths:
        if not target.openai:
            say("bench     no OpenAI endpoint recorded for this deployment (started with --no-openai?): skipped")
        else:
            model = await openai_model_id(target.openai)
            paths.append(OpenAIPath(target.openai, args.prompt, args.max_tokens, tokens, model))
    raw = RawModel(target, prompt_len, args.max_tokens, args.raw_repeats, args.vocab) if "raw" in args.paths else None
    if "raw-route" in args.paths:
        probe = raw or RawModel(target, prompt_len, args.max_tokens, 1, args.vocab)
        paths.insert(0, RawRoutePath(target, prompt_len, args.max_tokens, probe.vocab, probe.decoupled, args.prompt))
    if "raw-loop" in args.paths:
        probe = raw or RawModel(target, prompt_len, args.max_tokens, 1, args.vocab)
        paths.insert(0, RawLoopPath(target, prompt_len, args.max_tokens, probe.vocab, probe.decoupled))
    report: dict[str, Any] = {
        "target": {k: str(v) for k, v in asdict(target).items()},
        "machine": machine(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "argv": sys.argv[1:],
        "prompt_tokens": prompt_len,
        "max_tokens": args.max_tokens,
        "tokens_counted_by": "re-tokenizing each answer's new text with the deployment's tokenizer "
        "(repository/preprocessing/1)",
        "streaming": {p.name: p.streams for p in paths},
        "slo": {"ttft_ms": args.slo_ttft_ms, "itl_ms": args.slo_itl_ms},
        "levels": [],
    }
    if raw:
        report["raw"] = {
            "vocab": raw.vocab,
            "decoupled": raw.decoupled,
            "max_batch_size": raw.max_batch,
            "repeats": raw.repeats,
            "prompt_tokens": prompt_len,
        }
    counters = Counters(target.http)
    for path in paths:  # one warm-up request each (loads lazily built state: tokenizers, CUDA graphs)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=args.timeout)) as session:
            try:
                await path(session)
            except (TimeoutError, aiohttp.ClientError, RuntimeError, ValueError) as exc:
                raise SystemExit(
                    f"error: the {path.name} path's first request failed: {type(exc).__name__}: {exc}\n"
                    "hint: choose a --prompt and --max-tokens the model accepts (try them with `ftx generate`), "
                    "check the deployment with `ftx ps`, or leave the path out with --paths"
                ) from None
        _sent(counters, path, 1)
        report["streaming"][path.name] = path.streams
    if args.soak_seconds:
        return await run_soak(args, target, paths, report)
    for c in args.concurrency:
        n = args.requests or max(8, 4 * c)
        raw_rate = raw.tokens_per_s(c) if raw else None
        if raw:
            counters.sent(raw=raw.sent)
        if raw_rate is not None:
            say(f"bench     raw batch {c}: {raw_rate:.1f} tok/s")
        loop_rate: float | None = None
        for path in paths:
            level = Level(path.name, c, n, raw_tokens_per_s=raw_rate)
            before = await counters.read()
            samples, errors, wall = await closed_loop(path, c, n, args.timeout)
            _sent(counters, path, len(samples))
            level.models = model_costs(before, await counters.read())
            summarize(level, samples, errors, wall, args.max_tokens, path.streams, (args.slo_ttft_ms, args.slo_itl_ms))
            if raw_rate and level.tokens_per_s:
                level.vs_raw = level.tokens_per_s / raw_rate
            if path.name == "raw-loop":
                loop_rate = level.tokens_per_s or None
            elif loop_rate and level.tokens_per_s:
                level.vs_loop = level.tokens_per_s / loop_rate
            report["levels"].append(level.as_dict())
            say(
                f"bench     {path.name} c={c}: {level.requests_per_s:.2f} req/s, {level.tokens_per_s:.1f} tok/s, "
                f"TTFT p50 {level.ttft_p50_ms:.0f} ms" + (f", {level.errors} errors" if level.errors else "")
            )
        if raw and not paths:
            report["levels"].append(Level("raw", c, args.raw_repeats, raw_tokens_per_s=raw_rate).as_dict())
        if raw and raw.refused:
            report["raw_refused"] = {str(b): why for b, why in raw.refused.items()}
        if args.json:  # what is measured so far survives a run cut short
            args.json.write_text(json.dumps(report, indent=2))
    for rate in args.rates:
        n = args.requests or max(8, int(rate * args.open_seconds))
        for path in paths:
            level = Level(path.name, 0, n, rate=rate)
            before = await counters.read()
            samples, errors, wall = await open_loop(path, rate, n, args.timeout, seed=int(rate * 1000))
            _sent(counters, path, len(samples))
            level.models = model_costs(before, await counters.read())
            summarize(level, samples, errors, wall, args.max_tokens, path.streams, (args.slo_ttft_ms, args.slo_itl_ms))
            report["levels"].append(level.as_dict())
            say(
                f"bench     {path.name} at {rate:g} req/s (open loop): {level.requests_per_s:.2f} req/s, "
                f"goodput {level.goodput_rps:.2f} req/s, TTFT p50 {level.ttft_p50_ms:.0f} ms"
            )
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))
    return report


async def run_soak(
    args: argparse.Namespace, target: Target, paths: list[Any], report: dict[str, Any]
) -> dict[str, Any]:
    """``--soak-seconds``: the paths at one concurrency for that long (:mod:`serving_soak`); the JSON is rewritten
    after every window, so a soak cut short leaves what it measured."""
    from ftx_triton.paths import ftx_home
    from serving_soak import deployment_pids, soak

    pids = deployment_pids(target.pid, ftx_home()) if target.pid else []
    say(
        f"soak      {args.concurrency[0]} clients on {','.join(p.name for p in paths)} for {args.soak_seconds:g} s; "
        f"memory of processes {pids or '(none found)'} and their children"
    )

    def save(partial: Any) -> None:
        if args.json:
            args.json.write_text(json.dumps({**report, "soak": partial.as_dict()}, indent=2))

    result = await soak(
        paths,
        args.concurrency[0],
        args.soak_seconds,
        timeout_s=args.timeout,
        max_tokens=args.max_tokens,
        pids=pids,
        window_s=args.soak_window,
        sample_s=args.soak_sample,
        max_growth_mb=args.soak_max_growth_mb,
        on_window=save,
        say=say,
    )
    report["soak"] = result.as_dict()
    return report


def _sent(counters: Counters, path: Any, requests: int) -> None:
    """Tell Triton's counters what a path sent: through the ensemble, or to the raw model alone (the raw loop,
    and the OpenAI endpoint when it reads the model's ids itself)."""
    if path.name in ("raw-loop", "raw-route") or getattr(path, "route", "ensemble") == "tokens":
        counters.sent(raw=requests)
    else:
        counters.sent(text=requests)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def markdown(report: dict[str, Any]) -> str:
    """The table for docs/benchmarks.md."""
    if "soak" in report:
        from serving_soak import markdown as soak_markdown

        return soak_markdown(report["soak"])
    lines = [
        "| path | concurrency | requests | errors | short | garbled | req/s | tok/s | TTFT p50 ms | TTFT p90 ms "
        "| ITL p50 ms | ITL p90 ms | latency p50 ms | raw tok/s (batch = c) | vs raw | vs loop | goodput req/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["levels"]:
        raw, ratio = row.get("raw_tokens_per_s"), row.get("vs_raw")
        if row["path"] == "raw":  # --paths raw: the raw model alone
            lines.append(f"| raw | {row['concurrency']} |" + " - |" * 11 + f" {_ms(raw)} | - | - | - |")
            continue
        loop = row.get("vs_loop")
        where = f"{row['rate']:g}/s open" if row.get("rate") else str(row["concurrency"])
        lines.append(
            f"| {row['path']} | {where} | {row['requests']} | {row['errors']} | {row['short']} "
            f"| {row.get('garbled', 0)} "
            f"| {row['requests_per_s']:.2f} | {row['tokens_per_s']:.1f} | {_ms(row['ttft_p50_ms'])} "
            f"| {_ms(row['ttft_p90_ms'])} | {_ms(row['itl_p50_ms'])} | {_ms(row['itl_p90_ms'])} "
            f"| {_ms(row['latency_p50_ms'])} | {'-' if raw is None else f'{raw:.1f}'} "
            f"| {'-' if ratio is None else f'{ratio:.2f}'} | {'-' if loop is None else f'{loop:.2f}'} "
            f"| {row.get('goodput_rps', 0):.2f} |"
        )
    if not any(row.get("models") for row in report["levels"]):
        return "\n".join(lines)
    lines += [
        "",
        "| path | concurrency | model | requests | executions | mean batch | batch x executions "
        "| queue ms / request | compute ms / request |",
        "|---|---:|---|---:|---:|---:|---|---:|---:|",
    ]
    for row in report["levels"]:
        for name, cost in row.get("models", {}).items():
            batches = " ".join(f"{size}x{n}" for size, n in cost.get("batches", {}).items()) or "-"
            lines.append(
                f"| {row['path']} | {row['concurrency']} | {name} | {cost['requests']} | {cost['executions']} "
                f"| {cost['mean_batch']:.1f} | {batches} | {cost['queue_ms']:.1f} | {cost['compute_ms']:.1f} |"
            )
    return "\n".join(lines)


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        levels = []
    if not levels or any(c < 1 or c > 1024 for c in levels):
        raise argparse.ArgumentTypeError("a comma-separated list of 1..1024, e.g. 1,8,32,64")
    return levels


def _rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        rates = []
    if not rates or any(not 0 < r <= 10000 for r in rates):
        raise argparse.ArgumentTypeError("a comma-separated list of request rates per second, e.g. 2,4,8")
    return rates


def _paths(text: str) -> list[str]:
    paths = [p.strip() for p in text.split(",") if p.strip()]
    if not paths or set(paths) - {"text", "openai", "raw", "raw-loop", "raw-route"}:
        raise argparse.ArgumentTypeError("a comma-separated subset of text,openai,raw,raw-loop,raw-route")
    return paths


def check_soak(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Settle the request timeout and, for a soak, its settings: one concurrency, the client paths (``raw``, one
    fixed batch rather than clients, is left out), positive windows and samples."""
    if args.timeout is None:
        args.timeout = 120.0 if args.soak_seconds else 600.0
    if args.timeout <= 0:
        parser.error("--timeout must be positive (seconds one request may take)")
    if not args.soak_seconds:
        return
    if args.soak_seconds < 0 or args.soak_window <= 0 or args.soak_sample <= 0 or args.soak_max_growth_mb < 0:
        parser.error("--soak-seconds, --soak-window and --soak-sample must be positive, --soak-max-growth-mb >= 0")
    if len(args.concurrency) != 1:
        parser.error("a soak runs one level: give --concurrency one number of clients, e.g. --concurrency 64")
    if args.rates:
        parser.error("a soak is a closed loop: leave out --rates (run the open-loop levels without --soak-seconds)")
    args.paths = [p for p in args.paths if p != "raw"]
    if not args.paths:
        parser.error("a soak needs client paths: --paths text, openai and/or raw-loop")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", nargs="?", help="The server (NAME or MODEL from `ftx ps`); default: the only one.")
    parser.add_argument("--url", help="Triton's HTTP address of the deployment (http://HOST:PORT, see `ftx ps`).")
    parser.add_argument("--concurrency", type=_levels, default=[1, 8, 32, 64], help="Levels (default 1,8,32,64).")
    parser.add_argument(
        "--requests", type=int, default=0, help="Requests per level and path (default: 4 per client, at least 8)."
    )
    parser.add_argument("--max-tokens", type=int, default=128, help="Tokens each request asks for (default 128).")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="The prompt of every text/OpenAI request.")
    parser.add_argument(
        "--paths", type=_paths, default=["text", "openai", "raw", "raw-loop"], help="Default text,openai,raw,raw-loop."
    )
    parser.add_argument(
        "--rates", type=_rates, default=[], help="Open-loop levels: Poisson arrival rates in requests/s, e.g. 2,4,8."
    )
    parser.add_argument(
        "--open-seconds", type=float, default=20.0, help="An open level sends rate x this many requests (at least 8)."
    )
    parser.add_argument("--slo-ttft-ms", type=float, default=1000.0, help="Goodput's time-to-first-token target.")
    parser.add_argument("--slo-itl-ms", type=float, default=50.0, help="Goodput's inter-token latency target.")
    parser.add_argument("--raw-repeats", type=int, default=3, help="Raw-model requests per batch (median).")
    parser.add_argument(
        "--vocab",
        type=int,
        default=0,
        help="The raw model's vocabulary size (default: vocab_size of the checkpoint it serves).",
    )
    parser.add_argument(
        "--timeout", type=float, help="Seconds one request may take (default 600; 120 in a soak, where it is a hang)."
    )
    parser.add_argument("--json", type=Path, help="Also write the figures here.")
    soak = parser.add_argument_group("soak (--soak-seconds): one concurrency, the paths mixed, judged PASS or FAIL")
    soak.add_argument(
        "--soak-seconds",
        type=float,
        default=0.0,
        help="Run --concurrency's one level of closed-loop clients (client i on path i mod the paths) for this long; "
        "exit 1 unless 0 errors, 0 hangs, 0 garbled, 0 incomplete and memory flat.",
    )
    soak.add_argument("--soak-window", type=float, default=60.0, help="Seconds per printed window (default 60).")
    soak.add_argument("--soak-sample", type=float, default=5.0, help="Seconds between memory samples (default 5).")
    soak.add_argument(
        "--soak-max-growth-mb",
        type=float,
        default=32.0,
        help="Most the deployment's RSS may grow: last window's median over the first window's peak (default 32).",
    )
    args = parser.parse_args(argv)
    check_soak(parser, args)
    from ftx_triton.errors import FtxError

    try:
        target = find_target(args.name, args.url)
    except FtxError as exc:
        say(f"error: {exc.message}" + (f"\nhint: {exc.hint}" if exc.hint else ""))
        raise SystemExit(1) from None
    say(f"bench     {target.model}: HTTP {target.http}, gRPC {target.grpc}, OpenAI {target.openai or '-'}")
    report = asyncio.run(run(args, target))
    print(markdown(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    if "soak" in report:
        say(f"soak      {report['soak']['summary']['verdict']}")
        if report["soak"]["summary"]["verdict"] != "PASS":
            raise SystemExit(1)
    return report


if __name__ == "__main__":
    main()
