"""The soak of ``bench_serving.py --soak-seconds N``: ``c`` closed-loop clients for N seconds against a deployment.

Client ``i`` sends on path ``i mod len(paths)`` (``--paths text,openai`` mixes both at once), back to back until
the N seconds are over; the requests in flight then end (each within the request timeout). Every request is
cut at the timeout (``asyncio.wait_for``), so a hang is a counted failure (``hangs``), never a stuck run; any
other exception is an error. Each answer is checked: more tokens than asked is ``garbled`` (pieces repeated or
out of order), none at all or fewer than asked while the server says it stopped for length (OpenAI's
``finish_reason``) is ``incomplete``; fewer than asked after an honest stop is ``short`` (reported, allowed).

Every ``sample_s`` seconds the deployment's memory is read: the RSS of the tritonserver's process tree (its
supervisor, every MPI rank, the Python-backend stubs) plus the OpenAI front's (ftx's records of the
deployment, :mod:`ftx_triton.server.front_records`), and the GPUs' used memory from ``nvidia-smi`` when there is
one (reported, not judged: FasterTransformer's allocator keeps what a larger batch once took). Each window
(``window_s``) prints its requests, tok/s, errors and RSS; the summary judges:

* PASS needs requests answered, 0 errors, 0 hangs, 0 garbled, 0 incomplete, and memory flat: the RSS
  growth, the median of the last window's samples minus the highest sample of the first window (which holds
  the warm-up: pools and caches filling up to ``c`` clients' worth), at most ``max_growth_mb`` (not judged
  with a single window). The least-squares slope over all samples (MB/minute) is reported beside it.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

MB = 1024 * 1024
ERROR_PAUSE_S = 0.2
"""A client waits this long after a failed request: a dead server answers at once, and 64 clients retrying in a
tight loop would only fill the error count and the CPU."""


# --------------------------------------------------------------------------- the deployment's memory


def deployment_pids(pid: int, home: Path) -> list[int]:
    """The processes whose trees make up a deployment: the pid ftx recorded for its tritonserver (the supervisor,
    whose tree holds every rank and stub) and its OpenAI front's, from ftx's endpoint records."""
    from ftx_triton.server.front_records import read_records

    return [pid] + [r["pid"] for r in read_records(home) if r["triton_pid"] == pid and r["pid"] != pid]


def tree_rss(roots: Sequence[int]) -> tuple[int, int]:
    """(bytes, processes): the summed RSS of ``roots`` and all their descendants, each process counted once."""
    import psutil

    seen: dict[int, int] = {}
    for root in roots:
        try:
            top = psutil.Process(root)
            procs = [top, *top.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        for proc in procs:
            if proc.pid in seen:
                continue
            try:
                seen[proc.pid] = proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
    return sum(seen.values()), len(seen)


def gpu_used_mb() -> float | None:
    """The used memory of every GPU, summed (MiB, from ``nvidia-smi``); None without one."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        return float(sum(float(line) for line in out.stdout.split() if line.strip()))
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


@dataclass
class MemorySample:
    t_s: float
    rss_mb: float
    processes: int
    gpu_mb: float | None


# --------------------------------------------------------------------------- the counts


@dataclass
class Tally:
    """What came back in one window, or over the whole soak."""

    requests: int = 0
    tokens: int = 0
    errors: int = 0
    hangs: int = 0
    garbled: int = 0
    incomplete: int = 0
    short: int = 0

    def add(self, other: Tally) -> None:
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)


def judge_answer(tokens: int, finish: str, max_tokens: int) -> str:
    """``complete``, ``short`` (an honest stop before ``max_tokens``), ``garbled`` (more than asked) or
    ``incomplete`` (nothing, or fewer than asked although the server says it stopped for length)."""
    if tokens > max_tokens:
        return "garbled"
    if tokens == max_tokens:
        return "complete"
    if tokens == 0 or finish == "length":
        return "incomplete"
    return "short"


@dataclass
class Window:
    index: int
    end_s: float
    tally: Tally
    tokens_per_s: float
    rss_mb: float
    rss_max_mb: float
    processes: int
    gpu_mb: float | None

    def line(self) -> str:
        t = self.tally
        gpu = f", GPU {self.gpu_mb:.0f} MiB" if self.gpu_mb is not None else ""
        return (
            f"soak      window {self.index} (to {self.end_s:.0f} s): {t.requests} requests, "
            f"{self.tokens_per_s:.1f} tok/s, {t.errors} errors, {t.hangs} hangs, {t.garbled} garbled, "
            f"{t.incomplete} incomplete, RSS {self.rss_mb:.0f} MB ({self.processes} processes){gpu}"
        )


@dataclass
class Soak:
    """One soak: its settings, windows, memory samples, the totals and the verdict."""

    paths: list[str]
    clients: int
    seconds: float
    timeout_s: float
    max_tokens: int
    max_growth_mb: float
    windows: list[Window] = field(default_factory=list)
    memory: list[MemorySample] = field(default_factory=list)
    total: Tally = field(default_factory=Tally)
    per_path: dict[str, Tally] = field(default_factory=dict)
    first_error: str = ""
    wall_s: float = 0.0
    summary: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------- the run


Call = Callable[[aiohttp.ClientSession], Awaitable[Any]]


async def soak(
    paths: Sequence[Any],
    clients: int,
    seconds: float,
    *,
    timeout_s: float,
    max_tokens: int,
    pids: Sequence[int],
    window_s: float = 60.0,
    sample_s: float = 5.0,
    max_growth_mb: float = 32.0,
    gpu: bool = True,
    on_window: Callable[[Soak], None] = lambda _soak: None,
    say: Callable[[str], None] = print,
) -> Soak:
    """Run the soak (``paths``: callables with a ``name``, answering a ``Sample``-like object with ``tokens``
    and optionally ``finish``); ``on_window`` is called after each window (to write what is measured so far)."""
    result = Soak([p.name for p in paths], clients, seconds, timeout_s, max_tokens, max_growth_mb)
    result.per_path = {p.name: Tally() for p in paths}
    window = Tally()
    started = time.perf_counter()
    deadline = started + seconds

    def count(path: str, outcome: str, tokens: int = 0) -> None:
        for tally in (window, result.total, result.per_path[path]):
            tally.requests += 1
            tally.tokens += min(tokens, max_tokens)
            if outcome != "complete":  # the name of the Tally field it counts in
                setattr(tally, outcome, getattr(tally, outcome) + 1)

    async def sample() -> MemorySample:
        rss, procs = await asyncio.to_thread(tree_rss, pids)
        used = await asyncio.to_thread(gpu_used_mb) if gpu else None
        got = MemorySample(round(time.perf_counter() - started, 2), round(rss / MB, 1), procs, used)
        result.memory.append(got)
        return got

    def close_window(now: float, window_started: float, samples: list[MemorySample]) -> None:
        nonlocal window
        last = samples[-1]
        done = Window(
            len(result.windows) + 1,
            round(now - started, 1),
            window,
            window.tokens / max(now - window_started, 1e-9),
            last.rss_mb,
            max(s.rss_mb for s in samples),
            last.processes,
            last.gpu_mb,
        )
        result.windows.append(done)
        window = Tally()
        say(done.line())
        on_window(result)

    async def client(i: int, session: aiohttp.ClientSession) -> None:
        path = paths[i % len(paths)]
        while time.perf_counter() < deadline:
            try:
                answer = await asyncio.wait_for(path(session), timeout_s)
            except TimeoutError:
                count(path.name, "hangs")
                result.first_error = result.first_error or f"{path.name}: no answer within {timeout_s:g} s"
                continue
            except Exception as exc:  # every failure of a request is counted, whatever raised it
                count(path.name, "errors")
                result.first_error = result.first_error or f"{path.name}: {type(exc).__name__}: {exc}"[:300]
                await asyncio.sleep(ERROR_PAUSE_S)
                continue
            count(path.name, judge_answer(answer.tokens, getattr(answer, "finish", ""), max_tokens), answer.tokens)

    async def monitor(stop: asyncio.Event) -> None:
        window_started = time.perf_counter()
        samples = [await sample()]
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), sample_s)
            except TimeoutError:
                pass
            samples.append(await sample())
            now = time.perf_counter()
            if now - window_started >= window_s - 1e-3 or stop.is_set():
                close_window(now, window_started, samples)
                window_started, samples = now, [samples[-1]]

    stop = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        watcher = asyncio.create_task(monitor(stop))
        await asyncio.gather(*(client(i, session) for i in range(clients)))
        result.wall_s = round(time.perf_counter() - started, 2)
        stop.set()
        await watcher
    result.summary = summarize(result)
    return result


def summarize(result: Soak) -> dict[str, Any]:
    """The totals, the memory's first/last/max, its growth and slope, and the verdict with its reasons."""
    t = result.total
    rss = [m.rss_mb for m in result.memory]
    summary: dict[str, Any] = {
        **asdict(t),
        "tokens_per_s": round(t.tokens / result.wall_s, 1) if result.wall_s else 0.0,
        "rss_first_mb": rss[0] if rss else None,
        "rss_last_mb": rss[-1] if rss else None,
        "rss_max_mb": max(rss) if rss else None,
        "rss_slope_mb_per_min": None,
        "rss_growth_mb": None,
    }
    if len(rss) >= 2 and len({m.t_s for m in result.memory}) >= 2:
        slope, _ = statistics.linear_regression([m.t_s for m in result.memory], rss)
        summary["rss_slope_mb_per_min"] = round(slope * 60, 2)
    windows = result.windows
    if len(windows) >= 2:
        first_end, last_start = windows[0].end_s, windows[-2].end_s
        first = [m.rss_mb for m in result.memory if m.t_s <= first_end]
        last = [m.rss_mb for m in result.memory if m.t_s > last_start]
        if first and last:
            summary["rss_growth_mb"] = round(statistics.median(last) - max(first), 1)
    gpu = [m.gpu_mb for m in result.memory if m.gpu_mb is not None]
    if gpu:
        summary.update(gpu_first_mb=gpu[0], gpu_last_mb=gpu[-1], gpu_max_mb=max(gpu))
    reasons = []
    if t.requests - t.errors - t.hangs <= 0:
        reasons.append("no request was answered")
    reasons += [f"{getattr(t, k)} {k}" for k in ("errors", "hangs", "garbled", "incomplete") if getattr(t, k)]
    growth = summary["rss_growth_mb"]
    if growth is not None and growth > result.max_growth_mb:
        reasons.append(f"RSS grew {growth:.1f} MB (limit {result.max_growth_mb:g} MB)")
    summary["verdict"] = "FAIL" if reasons else "PASS"
    summary["reasons"] = reasons
    return summary


def markdown(result: dict[str, Any]) -> str:
    """The windows' table, the totals and the verdict line of a soak (:meth:`Soak.as_dict`)."""
    lines = [
        f"Soak: {result['clients']} clients on {', '.join(result['paths'])} for {result['seconds']:g} s "
        f"(request timeout {result['timeout_s']:g} s, {result['max_tokens']} tokens each)",
        "",
        "| window | ends at s | requests | tok/s | errors | hangs | garbled | incomplete | short | RSS MB | GPU MiB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for w in result["windows"]:
        t = w["tally"]
        gpu = "-" if w["gpu_mb"] is None else f"{w['gpu_mb']:.0f}"
        lines.append(
            f"| {w['index']} | {w['end_s']:.0f} | {t['requests']} | {w['tokens_per_s']:.1f} | {t['errors']} "
            f"| {t['hangs']} | {t['garbled']} | {t['incomplete']} | {t['short']} | {w['rss_mb']:.0f} | {gpu} |"
        )
    s = result["summary"]

    def mb(key: str) -> str:
        return "-" if s.get(key) is None else f"{s[key]:.1f}"

    lines += [
        "",
        f"requests {s['requests']}, errors {s['errors']}, hangs {s['hangs']}, garbled {s['garbled']}, "
        f"incomplete {s['incomplete']}, short {s['short']}, {s['tokens_per_s']:.1f} tok/s over {result['wall_s']:.0f} s",
        f"RSS first {mb('rss_first_mb')} MB, last {mb('rss_last_mb')} MB, max {mb('rss_max_mb')} MB, "
        f"growth {mb('rss_growth_mb')} MB (limit {result['max_growth_mb']:g}), slope {mb('rss_slope_mb_per_min')} MB/min"
        + (f"; GPU first {mb('gpu_first_mb')}, last {mb('gpu_last_mb')} MiB" if "gpu_first_mb" in s else ""),
    ]
    lines.append(
        "per path: "
        + "; ".join(
            f"{name} {t['requests']} requests, {t['errors']} errors, {t['hangs']} hangs, {t['garbled']} garbled, "
            f"{t['incomplete']} incomplete"
            for name, t in result["per_path"].items()
        )
    )
    if result["first_error"]:
        lines.append(f"first error: {result['first_error']}")
    lines.append(f"SOAK {s['verdict']}" + (f": {'; '.join(s['reasons'])}" if s["reasons"] else ""))
    return "\n".join(lines)
