"""Run fastertransformer_backend's client scripts as they are, recording what they exchange.

Usage (with the clients' own interpreter, numpy < 1.24): ``python upstream_client_launcher.py JOBS.json``.
JOBS holds ``results`` (a path) and ``jobs``: ``{"name", "script", "args", "cwd", "env", "record"}`` each.
The client libraries the scripts import (numpy, tritonclient, and torch/transformers/sacrebleu where
installed) are imported once here; each script then runs unchanged as ``__main__`` in a forked child (its
directory first on ``sys.path`` and ``sys.argv`` as ``python SCRIPT ARGS`` has them), up to ``parallel``
at a time. Forking saves each script seconds of imports, and running a few at once overlaps their
waits (``identity_test.py`` sleeps 5 s) with the server's work. tritonclient's ``infer`` is wrapped so
that every call's model, input arrays and output arrays (or its error) are pickled to the job's
``record``: the scripts print what they get and swallow exceptions, so the test checks these records
rather than the exit code alone. Each job's exit status, stdout, stderr and seconds go to ``results``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import pickle
import runpy
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

RECORDS: list[dict[str, Any]] = []
PRELOADED = ("torch", "transformers", "sacrebleu", "sentencepiece", "google.protobuf.json_format")


def _output_names(response: Any) -> list[str]:
    if isinstance(response, dict):
        return [o["name"] for o in response.get("outputs", ())]
    return [o.name for o in response.outputs]


def _wrap(module: Any) -> None:
    set_data = module.InferInput.set_data_from_numpy

    def set_data_from_numpy(self: Any, array: np.ndarray, *args: Any, **kwargs: Any) -> Any:
        self._recorded_array = np.array(array, copy=True)
        return set_data(self, array, *args, **kwargs)

    infer = module.InferenceServerClient.infer

    def recorded_infer(self: Any, model_name: str, inputs: list[Any], *args: Any, **kwargs: Any) -> Any:
        entry: dict[str, Any] = {
            "model": model_name,
            "inputs": {i.name(): getattr(i, "_recorded_array", None) for i in inputs},
        }
        RECORDS.append(entry)
        try:
            result = infer(self, model_name, inputs, *args, **kwargs)
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"
            raise
        entry["outputs"] = {n: result.as_numpy(n) for n in _output_names(result.get_response())}
        return result

    module.InferInput.set_data_from_numpy = set_data_from_numpy
    module.InferenceServerClient.infer = recorded_infer


def _wrap_stream(module: Any) -> None:
    """gRPC streams: each ``async_stream_infer`` is recorded with every response the stream's
    callback gets (``responses``: outputs or an ``error`` each)."""
    client = module.InferenceServerClient
    start_stream, async_stream_infer = client.start_stream, client.async_stream_infer

    def recorded_start_stream(self: Any, callback: Any, *args: Any, **kwargs: Any) -> Any:
        def recording(result: Any, error: Any) -> Any:
            entry = getattr(self, "_recorded_stream", None)
            if entry is not None:
                if error is not None:
                    entry["responses"].append({"error": str(error)})
                else:
                    names = _output_names(result.get_response())
                    entry["responses"].append({"outputs": {n: result.as_numpy(n) for n in names}})
            return callback(result, error)

        return start_stream(self, recording, *args, **kwargs)

    def recorded_async_stream_infer(self: Any, model_name: str, inputs: list[Any], *args: Any, **kwargs: Any) -> Any:
        entry: dict[str, Any] = {
            "model": model_name,
            "inputs": {i.name(): getattr(i, "_recorded_array", None) for i in inputs},
            "responses": [],
        }
        RECORDS.append(entry)
        self._recorded_stream = entry
        return async_stream_infer(self, model_name, inputs, *args, **kwargs)

    client.start_stream = recorded_start_stream
    client.async_stream_infer = recorded_async_stream_infer


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _child(job: dict[str, Any], out: Path, err: Path) -> None:
    """In the forked child: run the script as ``python SCRIPT ARGS`` would, then leave without the
    parent's exit handlers."""
    code = 1
    try:
        with open(out, "w") as o, open(err, "w") as e:
            os.dup2(o.fileno(), 1)
            os.dup2(e.fileno(), 2)
        os.chdir(job["cwd"])
        os.environ.update(job.get("env", {}))
        for entry in reversed(os.environ.get("PYTHONPATH", "").split(os.pathsep)):
            if entry and entry not in sys.path:
                sys.path.insert(0, entry)
        sys.argv = [job["script"], *job["args"]]
        sys.path.insert(0, str(Path(job["script"]).parent))
        try:
            runpy.run_path(job["script"], run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc)
        except BaseException:
            traceback.print_exc()
            code = 1
        Path(job["record"]).write_bytes(pickle.dumps(RECORDS))
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    for name in PRELOADED:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    for module in (httpclient, grpcclient):
        _wrap(module)
    _wrap_stream(grpcclient)
    logs = Path(tempfile.mkdtemp(prefix="upstream-clients-"))
    pending = list(enumerate(plan["jobs"]))
    running: dict[int, tuple[int, float]] = {}
    results: list[dict[str, Any] | None] = [None] * len(pending)
    parallel = int(plan.get("parallel", 1))
    while pending or running:
        while pending and len(running) < parallel:
            index, job = pending.pop(0)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(job, logs / f"{index}.out", logs / f"{index}.err")
            running[pid] = (index, time.monotonic())
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            for child, (index, started) in running.items():
                if time.monotonic() - started > plan["jobs"][index].get("timeout", 600):
                    os.kill(child, signal.SIGKILL)
            time.sleep(0.05)
            continue
        index, started = running.pop(pid)
        job = plan["jobs"][index]
        results[index] = {
            "name": job["name"],
            "rc": os.waitstatus_to_exitcode(status),
            "stdout": (logs / f"{index}.out").read_text(errors="replace"),
            "stderr": (logs / f"{index}.err").read_text(errors="replace"),
            "seconds": round(time.monotonic() - started, 1),
        }
    Path(plan["results"]).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
