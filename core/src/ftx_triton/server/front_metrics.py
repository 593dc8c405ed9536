"""The OpenAI endpoint's ``/metrics`` read back: its token-level series per level of a load (``ftx bench --via
openai``, ``benchmarks/``). The series themselves are written by :mod:`ftx_triton.openai_api.metrics`."""

from __future__ import annotations

import urllib.request
from typing import Any

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def read_metrics(url: str, timeout_s: float = 10.0) -> dict[str, float]:
    """The endpoint's series as ``{name{labels}: value}`` (``url``: its ``/metrics`` address)."""
    from prometheus_client.parser import text_string_to_metric_families

    with _OPENER.open(url, timeout=timeout_s) as response:
        text = response.read(16 << 20).decode("utf-8", "replace")
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k != "le")
            if "le" in sample.labels:
                continue  # buckets: the sums and counts are what the figures below need
            values[sample.name + (f"{{{labels}}}" if labels else "")] = float(sample.value)
    return values


def level_figures(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict[str, Any]:
    """What the endpoint measured between two readings: mean TTFT and ITL, output tokens/s, rejections."""

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    def mean_ms(series: str) -> float | None:
        n = delta(f"{series}_count")
        return 1000 * delta(f"{series}_sum") / n if n else None

    return {
        "ttft_avg_ms": mean_ms("ftx_time_to_first_token_seconds"),
        "itl_avg_ms": mean_ms("ftx_inter_token_latency_seconds"),
        "output_tokens_per_s": delta("ftx_output_tokens_total") / wall_s if wall_s > 0 else None,
        "completed": int(delta("ftx_requests_total{outcome=ok}")),
        "rejected": int(delta("ftx_requests_rejected_total")),
        "errors": int(delta("ftx_requests_total{outcome=error}")),
    }


__all__ = ["level_figures", "read_metrics"]
