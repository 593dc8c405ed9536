"""Run one of fastertransformer_backend's client scripts as it is, recording what it exchanges.

Usage (with the clients' own interpreter, numpy < 1.24): ``python upstream_client_launcher.py RECORD
SCRIPT [ARGS...]``. The script runs unchanged as ``__main__`` (its directory first on ``sys.path``, as
``python SCRIPT`` has it); tritonclient's ``infer`` is wrapped so that every call's model, input arrays
and output arrays (or its error) are pickled to RECORD when the script ends. The scripts print what
they get and swallow exceptions, so the test checks these records rather than the exit code alone.
"""

from __future__ import annotations

import atexit
import pickle
import runpy
import sys
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

RECORDS: list[dict[str, Any]] = []


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


def main() -> None:
    record, script, *args = sys.argv[1:]
    for module in (httpclient, grpcclient):
        _wrap(module)
    atexit.register(lambda: Path(record).write_bytes(pickle.dumps(RECORDS)))
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).parent))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
