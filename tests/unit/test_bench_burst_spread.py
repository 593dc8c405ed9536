"""The burst-spread benchmark's reading of Triton's trace (benchmarks/bench_burst_spread.py), on a trace written
here in Triton's file format (a list of entries: one naming each request's model and parent, others holding its
timestamps)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))

from bench_burst_spread import first_round, read_trace, returns  # noqa: E402

MS = 1_000_000


def _request(entries: list, rid: int, model: str, start: int, queue: int, compute: int, end: int, parent: int = 0):
    head = {"id": rid, "model_name": model, "model_version": 1}
    if parent:
        head["parent_id"] = parent
    stamps = [("REQUEST_START", start), ("QUEUE_START", queue), ("COMPUTE_START", compute), ("COMPUTE_END", end)]
    entries += [head, {"id": rid, "timestamps": [{"name": n, "ns": t} for n, t in stamps]}]


def test_a_burst_through_the_ensemble_is_measured_at_each_step(tmp_path: Path) -> None:
    """Four ensemble requests entering 1 ms apart; preprocessing tokenizes the first alone and the other three in
    one execution ending at 10 ms; the model runs them together from 30 ms to 100 ms, and the next round arrives
    from 101 to 125 ms."""
    entries: list = []
    for i in range(4):
        text = 10 + i
        _request(entries, text, "text", i * MS, i * MS, i * MS, 100 * MS)
        pre_start, pre_end = (0, 2 * MS) if i == 0 else (3 * MS, 10 * MS)
        _request(entries, 100 + i, "preprocessing", i * MS, i * MS, pre_start, pre_end, parent=text)
        arrival = 2 * MS if i == 0 else 10 * MS
        _request(entries, 200 + i, "fastertransformer", arrival, arrival, 30 * MS, 100 * MS, parent=text)
    for i in range(4):  # the next round
        text = 20 + i
        at = (101 + 8 * i) * MS
        _request(entries, text, "text", at, at, at, 300 * MS)
        _request(entries, 300 + i, "fastertransformer", at, at, 150 * MS, 200 * MS, parent=text)
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps(entries))
    records = read_trace(trace)
    assert len(records) == 20 and {r["model_name"] for r in records} == {"text", "preprocessing", "fastertransformer"}
    first = first_round(records, (0, 400 * MS), [0, MS // 2, MS, 2 * MS], 4, "text")
    assert first["sent_ms"] == 2.0 and first["entry_ms"] == 3.0 and first["model_ms"] == 8.0
    assert first["preprocessing"] == [1, 3] and first["preprocessing_ms"] == 10.0
    assert returns(records, (0, 400 * MS), 4, "text") == [24.0]
