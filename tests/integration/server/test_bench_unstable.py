"""``ftx bench --tool perf_analyzer`` on a server whose latency changes from one measurement window to the
next, as on a machine under load (issue 27, CI): the figures measured are the result; perf_analyzer must
not give up with "Failed to obtain stable measurement". Real tritonserver and perf_analyzer; the model is
a Python-backend model that sleeps longer for each request (1.5x), so any three windows differ by far more
than perf_analyzer's stability threshold would accept."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

import pytest
from triton_helpers import model_files

pytestmark = pytest.mark.skipif(find_spec("pytriton") is None, reason="nvidia-pytriton is not installed")

SLOWER_EACH_TIME = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.served = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            time.sleep(min(0.002 * 1.5 ** self.served, 2.0))
            self.served += 1
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", text)]))
        return responses
"""

CONFIG = """name: "slower"
backend: "python"
max_batch_size: 0
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
        { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""


def test_perf_analyzer_reports_windows_that_are_not_stable(tmp_path: Path) -> None:
    from ftx_triton.server.bench import find_perf_analyzer, run_perf_analyzer
    from ftx_triton.server.tritonserver import TritonServer

    binary = find_perf_analyzer()
    if binary is None:
        pytest.skip("perf_analyzer is not installed here (scripts/setup.sh --dev installs it)")
    model_files(tmp_path / "repo", "slower", CONFIG, SLOWER_EACH_TIME)
    with TritonServer(tmp_path / "repo", home=tmp_path / "home") as server:
        points = run_perf_analyzer(binary, server.grpc_url, "slower", "Hi", 4, [1], 4)
    assert [p.concurrency for p in points] == [1]
    assert points[0].throughput_rps > 0 and points[0].latency_p99_ms >= points[0].latency_p50_ms > 0
