#!/usr/bin/env python
"""What the gRPC front costs, and what a gzip bomb costs with it.

Serves a one-line Python-backend model (int32 ``input_ids`` + 1) on the real tritonserver with the gRPC
front, then alternates the same requests two ways, ``--repeats`` times:

- ``front``:  the public gRPC port (the front, then tritonserver's own port on the loopback);
- ``direct``: tritonserver's own gRPC port (what clients reached before the front).

for a small request (2x3 int32) and a large one (``--large-mib`` MiB of int32). Prints the median
latency of each and the ratio front/direct. Then sends a gzip message that inflates to ``--bomb-mib``
MiB (refused by the front) and prints the supervisor's and tritonserver's RSS before and after.

    python benchmarks/bench_grpc_front.py
    python benchmarks/bench_grpc_front.py --repeats 200 --large-mib 32 --bomb-mib 600
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("output_ids", (x + 1).astype(np.int32))]))
        return out
"""
CONFIG = """name: "add_one"
backend: "python"
max_batch_size: 0
input [{ name: "input_ids", data_type: TYPE_INT32, dims: [-1, -1] }]
output [{ name: "output_ids", data_type: TYPE_INT32, dims: [-1, -1] }]
instance_group [{ count: 1, kind: KIND_CPU }]
"""


def repository(root: Path) -> Path:
    model = root / "repo" / "add_one"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG)
    (model / "1" / "model.py").write_text(MODEL)
    return root / "repo"


def timed(url: str, data: Any) -> float:
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(url) as client:
        tensor = grpcclient.InferInput("input_ids", list(data.shape), "INT32")
        tensor.set_data_from_numpy(data)
        began = time.perf_counter()
        client.infer("add_one", [tensor], client_timeout=300)
        return time.perf_counter() - began


def rss_mib(pid: int) -> tuple[float, float]:
    """(supervisor, tritonserver) resident memory in MiB."""
    import psutil

    supervisor = psutil.Process(pid)
    triton = next(p for p in supervisor.children() if p.name() == "tritonserver")
    return supervisor.memory_info().rss / 2**20, triton.memory_info().rss / 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--large-mib", type=int, default=16)
    parser.add_argument("--bomb-mib", type=int, default=600)
    args = parser.parse_args()

    import numpy as np
    import tritonclient.grpc as grpcclient
    from ftx_triton.server.tritonserver import TritonServer
    from tritonclient.utils import InferenceServerException

    with tempfile.TemporaryDirectory() as tmp, TritonServer(repository(Path(tmp)), home=Path(tmp) / "home") as server:
        front, direct = server.grpc_url, f"127.0.0.1:{server._internal_grpc_port}"
        cases = {
            "small 2x3": np.arange(6, dtype=np.int32).reshape(2, 3),
            f"large {args.large_mib} MiB": np.zeros((1, args.large_mib << 18), np.int32),
        }
        print(f"tritonserver {direct} behind the gRPC front {front}; {args.repeats} repeats, alternating")
        for name, data in cases.items():
            times: dict[str, list[float]] = {"front": [], "direct": []}
            timed(front, data), timed(direct, data)  # warm both paths
            for _ in range(args.repeats if data.size < 1 << 20 else max(5, args.repeats // 10)):
                times["front"].append(timed(front, data))
                times["direct"].append(timed(direct, data))
            medians = {k: statistics.median(v) for k, v in times.items()}
            print(
                f"{name:>14}: front {medians['front'] * 1e3:8.2f} ms   direct {medians['direct'] * 1e3:8.2f} ms   "
                f"ratio {medians['front'] / medians['direct']:.2f}  (n={len(times['front'])})"
            )
        before = rss_mib(server.pid or 0)
        bomb = np.zeros((1, args.bomb_mib << 18), np.int32)
        with grpcclient.InferenceServerClient(front) as client:
            tensor = grpcclient.InferInput("input_ids", list(bomb.shape), "INT32")
            tensor.set_data_from_numpy(bomb)
            try:
                client.infer("add_one", [tensor], compression_algorithm="gzip", client_timeout=300)
                outcome = "ACCEPTED"
            except InferenceServerException as exc:
                outcome = str(exc)[:100]
        after = rss_mib(server.pid or 0)
        print(f"gzip message inflating to {args.bomb_mib} MiB: {outcome}")
        print(
            f"RSS supervisor {before[0]:.0f} -> {after[0]:.0f} MiB, tritonserver {before[1]:.0f} -> {after[1]:.0f} MiB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
