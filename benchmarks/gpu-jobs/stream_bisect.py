"""Which part of a streamed text request hangs GPT-J with the CUDA graph at tp N (diagnostic, not a test).

Deploys the GPU suite's tiny GPT-J (streaming, fp16) and sends, each with a short timeout, on one server while
requests pass and on a fresh one after a hang:
  raw-ids     the fastertransformer model streamed with input_ids/input_lengths/request_output_len only
  route       the same with every input the token route sends (preprocessing's own), and its outputs
  route-minus-G  the route without one group G (log probs, word lists, sampling settings)
  text        generate_stream through the text ensemble
then the same text request with FTX_FT_CUDA_GRAPH=0 as the control. Results: one JSON line each in OUT/bisect.jsonl.

  python benchmarks/gpu-jobs/stream_bisect.py --tp 2 --out DIR [--runtime python --cpu]   # --cpu: the python runtime here
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "gpu")]

import numpy as np  # noqa: E402

GROUPS = {
    "logprobs": ("is_return_log_probs",),
    "words": ("bad_words_list", "stop_words_list"),
    "sampling": ("runtime_top_k", "runtime_top_p", "temperature", "repetition_penalty", "random_seed", "beam_width"),
}


def log(out: Path, **row: Any) -> None:
    row["t"] = time.strftime("%H:%M:%S")
    line = json.dumps(row)
    print(line, flush=True)
    with (out / "bisect.jsonl").open("a") as f:
        f.write(line + "\n")


def deploy(checkpoint: Path, home: Path, tp: int, runtime: str) -> Any:
    from ftx_triton.engine.pipeline import Pipeline
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.plugins import load_host
    from ftx_triton.store.artifact_store import ArtifactStore

    settings = RunSettings.of(
        str(checkpoint),
        runtime=runtime,
        tp=tp,
        data_type="fp16" if runtime != "python" else "fp32",
        family="gptj",
        max_batch_size=4,
        tune_batch=3,
        tune_max_input_len=16,
        streaming=True,
        tune=False,
    )
    return Pipeline(load_host(), ArtifactStore(home), settings, say=lambda text: None).run()


def stream_raw(grpc_url: str, tensors: dict[str, np.ndarray], outputs: tuple[str, ...], timeout: float) -> str:
    """'ok N' (responses) or 'hung' or 'error ...'."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    client = grpcclient.InferenceServerClient(grpc_url)
    done = threading.Event()
    seen: list[Any] = []

    def callback(result: Any, error: Any) -> None:
        if error is not None:
            seen.append(f"error {error}")
            done.set()
            return
        seen.append(result)
        params = result.get_response().parameters
        if "triton_final_response" in params and params["triton_final_response"].bool_param:
            done.set()

    client.start_stream(callback=callback)
    inputs = []
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        item = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        item.set_data_from_numpy(array)
        inputs.append(item)
    client.async_stream_infer(
        "fastertransformer",
        inputs,
        outputs=[grpcclient.InferRequestedOutput(o) for o in outputs],
        enable_empty_final_response=True,
    )
    finished = done.wait(timeout)
    threading.Thread(target=client.stop_stream, daemon=True).start()
    errors = [s for s in seen if isinstance(s, str)]
    if errors:
        return errors[0][:300]
    return f"ok {len(seen)}" if finished else f"hung after {len(seen)} responses"


def stream_text(http_url: str, prompt: str, timeout: float) -> str:
    """'ok N events', 'hung/error ...' or 'error ...' of one ``generate_stream`` request through the ensemble."""
    from python_runtime_support import post_json

    payload = {"text_input": prompt, "max_tokens": 12, "stream": True}
    try:
        status, _headers, text = post_json(f"http://{http_url}/v2/models/text/generate_stream", payload, timeout)
    except Exception as exc:  # noqa: BLE001 - a diagnostic: the fault is the result
        return f"hung/error {type(exc).__name__}: {exc}"[:300]
    events = [line for line in text.splitlines() if line.startswith("data: ")]
    ok = status == 200 and events and "error" not in text
    return f"ok {len(events)} events" if ok else f"error {status} {text[:300]}"


class Session:
    def __init__(self, args: argparse.Namespace, checkpoint: Path, home: Path) -> None:
        self.args, self.checkpoint, self.home = args, checkpoint, home
        self.result: Any = None

    def up(self, graph: str | None = None) -> Any:
        if graph is None:
            os.environ.pop("FTX_FT_CUDA_GRAPH", None)
        else:
            os.environ["FTX_FT_CUDA_GRAPH"] = graph
        started = time.monotonic()
        self.result = deploy(self.checkpoint, self.home, self.args.tp, self.args.runtime)
        log(self.args.out, event="up", graph=graph, seconds=round(time.monotonic() - started, 1))
        return self.result

    def down(self) -> None:
        if self.result is not None:
            handle = self.result.endpoint.handle
            if handle is not None and handle.log_path is not None:
                text = handle.log_path.read_text(errors="replace")
                keep = [ln for ln in text.splitlines() if "ftx:" in ln or "FT]" in ln or "rror" in ln]
                log(self.args.out, event="server-log", lines=keep[-20:])
            started = time.monotonic()
            self.result.runtime.stop(self.result.endpoint)
            log(self.args.out, event="down", seconds=round(time.monotonic() - started, 1))
            self.result = None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runtime", default="fastertransformer-native")
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--timeout", type=float, default=15.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import test_native_ft as suite

    if args.cpu:
        suite.TRAIN_DEVICE = "cpu"
    home = Path(os.environ.get("FTX_HOME") or args.out / "home")
    work = Path(os.environ.get("FTX_BISECT_WORK", "/tmp/ftx-bisect"))
    checkpoint = work / "hf-gptj" / "hf"
    if not (checkpoint / "config.json").exists():
        suite._causal_model("gptj", checkpoint)
    log(args.out, event="checkpoint", path=str(checkpoint))

    from ftx_triton.client.token_stream import TokenRoute

    session = Session(args, checkpoint, home)
    result = session.up()
    route = TokenRoute(result.repository.path)
    route_inputs, prompt = route.inputs({"prompt": suite.PROMPTS[0], "max_tokens": 12})
    ids = np.array([prompt], dtype=np.uint32)
    raw = {
        "input_ids": ids,
        "input_lengths": np.array([[len(prompt)]], dtype=np.uint32),
        "request_output_len": np.array([[12]], dtype=np.uint32),
    }
    log(args.out, event="route-inputs", names=sorted(route_inputs), outputs=list(route.whole_outputs()))
    grpc_url = result.endpoint.grpc_url

    def probe(name: str, run: Any) -> bool:
        nonlocal grpc_url
        outcome = run()
        log(args.out, event="probe", probe=name, outcome=outcome)
        passed = outcome.startswith("ok")
        if not passed:
            session.down()
            fresh = session.up()
            grpc_url = fresh.endpoint.grpc_url
        return passed

    probe("raw-ids", lambda: stream_raw(grpc_url, raw, ("output_ids", "sequence_length"), args.timeout))
    full = probe("route", lambda: stream_raw(grpc_url, route_inputs, route.whole_outputs(), args.timeout))
    if not full:
        for group, names in GROUPS.items():
            kept = {k: v for k, v in route_inputs.items() if k not in names}
            outputs = route.whole_outputs() if group != "logprobs" else ("output_ids", "sequence_length")
            probe(
                f"route-minus-{group}",
                lambda kept=kept, outputs=outputs: stream_raw(grpc_url, kept, outputs, args.timeout),
            )
        for group, names in GROUPS.items():
            only = {**raw, **{k: v for k, v in route_inputs.items() if k in names}}
            outputs = route.whole_outputs() if group == "logprobs" else ("output_ids", "sequence_length")
            probe(
                f"raw-plus-{group}",
                lambda only=only, outputs=outputs: stream_raw(grpc_url, only, outputs, args.timeout),
            )
    probe("text", lambda: stream_text(session.result.endpoint.http_url, suite.PROMPTS[0], args.timeout))
    probe("raw-ids-after", lambda: stream_raw(grpc_url, raw, ("output_ids", "sequence_length"), args.timeout))
    session.down()
    if not args.cpu:
        session.up(graph="0")
        probe("text-graph-off", lambda: stream_text(session.result.endpoint.http_url, suite.PROMPTS[0], args.timeout))
        session.down()
    log(args.out, event="end")


if __name__ == "__main__":
    main()
