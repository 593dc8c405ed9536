"""The decode profile's trace analysis (benchmarks/bench_ft_profile.py) on a trace written here in the
format of benchmarks/native/cupti_trace.cc (no GPU needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))

from bench_ft_profile import analyse, table  # noqa: E402


def _trace(path: Path, steps: int, host_wait: int) -> Path:
    """``steps`` steps on device 0: a GEMM of 300 ns and an all-reduce of 200 ns launched by thread 7, then
    the length criterion (100 ns), launched 700 ns into the step, after which the host waits ``host_wait``
    ns before it launches the next step."""
    lines, corr, t = [], 0, 10_000
    for _ in range(steps):
        for offset, length, name in ((0, 300, "nvjet_sm90_gemm"), (400, 200, "void ftx::allreduce<half, 2>(P)")):
            corr += 1
            lines.append(f"A\t7\t{t + offset}\t{t + offset + 50}\t{corr}\tcuLaunchKernelEx")
            lines.append(f"K\t0\t13\t{t + offset + 60}\t{t + offset + 60 + length}\t{corr}\t{name}")
        corr += 1
        launched = t + 700
        lines.append(f"A\t7\t{t + 650}\t{launched}\t{corr}\tcudaLaunchKernel_v7000")
        lines.append(f"K\t0\t13\t{t + 800}\t{t + 900}\t{corr}\tvoid fastertransformer::length_criterion(bool*)")
        t = launched + host_wait  # the host's next launch: the next step
    path.write_text("\n".join(lines) + "\n")
    return path


def test_per_step_time_busy_share_and_host_wait_come_from_the_trace(tmp_path: Path) -> None:
    dev = analyse(_trace(tmp_path / "t.tsv", 12, host_wait=300), steps=10)["devices"][0]
    assert dev["step_us_median"] == pytest.approx(1.0)  # 700 ns of launches + 300 ns of waiting
    assert dev["kernels_per_step"] == pytest.approx(3.0)
    assert dev["gpu_busy_fraction"] == pytest.approx(0.6)  # 300 + 200 + 100 of every 1000 ns
    assert dev["host_wait_at_step_end_us_median"] == pytest.approx(0.3)
    assert dev["host_launch_span_us_median"] == pytest.approx(1.0)
    assert dev["host_launching_us_median"] == pytest.approx(0.7)
    names = {k["name"]: k for k in dev["kernels"]}
    assert names["allreduce"]["share"] == pytest.approx(0.2)
    assert names["nvjet_sm90_gemm"]["per_step"] == pytest.approx(1.0)
    assert {c["name"] for c in dev["host_calls"]} == {"cuLaunchKernelEx", "cudaLaunchKernel_v7000"}


def test_a_trace_with_too_few_steps_says_so(tmp_path: Path) -> None:
    out = analyse(_trace(tmp_path / "t.tsv", 5, host_wait=100), steps=10)
    assert "fewer than 11" in out["devices"][0]["error"]


def _run(rates: dict[int, float], ids: dict[int, str]) -> dict[str, object]:
    return {"untuned": {**rates, "ids": ids}, "step_bytes_per_gpu": 5.84e9}


def test_a_graph_variant_is_compared_with_its_eager_twin_and_the_rest_with_the_first() -> None:
    """The CUDA-graph variants' speed ratio and ids are their eager twin's (the same label without ", graph");
    a graph variant whose twin failed or did not run falls back to the first variant."""
    report = {
        "read_bandwidth_gbs": 3983.0,
        "batches": [1],
        "variants": {
            "custom AR, 2 AR/layer": _run({1: 300.0}, {1: "a"}),
            "custom AR, 1 AR/layer": {"error": "server did not start"},
            "custom AR, 2 AR/layer, graph": _run({1: 450.0}, {1: "a"}),
            "custom AR, 1 AR/layer, graph": _run({1: 480.0}, {1: "b"}),
        },
    }
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table(report).splitlines()[2:]}
    assert "| custom AR, 2 AR/layer | 1.500 | equal |" in rows["custom AR, 2 AR/layer, graph"]
    assert "| custom AR, 2 AR/layer | 1.600 | differ |" in rows["custom AR, 1 AR/layer, graph"]
    assert "failed: server did not start" in rows["custom AR, 1 AR/layer"]
    assert "| 682 | 0.44 |" in rows["custom AR, 2 AR/layer"]  # 1 x 3983 GB/s / 5.84 GB
