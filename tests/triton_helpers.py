"""Tiny Triton model repositories for tests that run a real tritonserver (Python backend)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
from ftx_triton.server.launch import SHM_PREFIX
from ftx_triton.server.process_tree import SHM_DIR, stat_fields

IO_CONFIG = """
max_batch_size: 0
input [{ name: "input_ids", data_type: TYPE_INT32, dims: [-1, -1] }]
output [{ name: "output_ids", data_type: TYPE_INT32, dims: [-1, -1] }]
"""

# The stub must run this interpreter's libpython (LD_LIBRARY_PATH has sysconfig LIBDIR first),
# so the add-one model refuses to load under any other Python version.
ADD_ONE_PY = """
import sys
import numpy as np
import triton_python_backend_utils as pb_utils

EXPECTED_VERSION = {version!r}


class TritonPythonModel:
    def initialize(self, args):
        if sys.version.split()[0] != EXPECTED_VERSION:
            raise RuntimeError(f"stub runs Python {{sys.version.split()[0]}}, expected {{EXPECTED_VERSION}}")

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
            out = pb_utils.Tensor("output_ids", (x + 1).astype(np.int32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""

FAILING_PY = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("initialize exploded on purpose")

    def execute(self, requests):
        return []
"""

ENSEMBLE_CONFIG = """
name: "{name}"
platform: "ensemble"
{io}
ensemble_scheduling {{
  step [
    {{ model_name: "{first}", model_version: -1,
       input_map {{ key: "input_ids" value: "input_ids" }},
       output_map {{ key: "output_ids" value: "intermediate_ids" }} }},
    {{ model_name: "{second}", model_version: -1,
       input_map {{ key: "input_ids" value: "intermediate_ids" }},
       output_map {{ key: "output_ids" value: "output_ids" }} }}
  ]
}}
"""


def model_files(repo: Path, name: str, config: str, source: str) -> Path:
    """Write model ``name`` of a repository: its ``config.pbtxt`` and version 1's ``model.py``."""
    model = repo / name
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(config)
    (model / "1" / "model.py").write_text(source)
    return model


def python_model(repo: Path, name: str, source: str) -> Path:
    """Write a Python-backend model ``name`` with the int32 input_ids → output_ids signature."""
    config = f'name: "{name}"\nbackend: "python"\n{IO_CONFIG}\ninstance_group [{{ count: 1, kind: KIND_CPU }}]\n'
    return model_files(repo, name, config, source)


def add_one_model(repo: Path, name: str) -> Path:
    version = sys.version.split()[0]
    return python_model(repo, name, ADD_ONE_PY.format(version=version))


def ensemble_model(repo: Path, name: str, first: str, second: str) -> Path:
    model = repo / name
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(ENSEMBLE_CONFIG.format(name=name, io=IO_CONFIG, first=first, second=second))
    return model


def add_repository(repo: Path, *, failing: bool = False) -> Path:
    """``add_one``, ``add_one_b`` and the ensemble ``add_two`` (+ ``broken`` if ``failing``)."""
    repo.mkdir(parents=True, exist_ok=True)
    add_one_model(repo, "add_one")
    add_one_model(repo, "add_one_b")
    ensemble_model(repo, "add_two", "add_one", "add_one_b")
    if failing:
        python_model(repo, "broken", FAILING_PY)
    return repo


INPUT = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int32)


def infer_http(url: str, model: str, data: np.ndarray = INPUT) -> np.ndarray:
    """One request over HTTP; the client is closed before returning (no keep-alive left open)."""
    import tritonclient.http as httpclient

    return _infer(httpclient, url, model, data)


def infer_grpc(url: str, model: str, data: np.ndarray = INPUT) -> np.ndarray:
    """One request over gRPC; the client is closed before returning."""
    import tritonclient.grpc as grpcclient

    return _infer(grpcclient, url, model, data)


def _infer(protocol: Any, url: str, model: str, data: np.ndarray) -> np.ndarray:
    """``input_ids`` -> ``output_ids`` through ``protocol`` (``tritonclient.http`` or ``tritonclient.grpc``)."""
    client = protocol.InferenceServerClient(url)
    try:
        tensor = protocol.InferInput("input_ids", list(data.shape), "INT32")
        tensor.set_data_from_numpy(data)
        return client.infer(model, [tensor]).as_numpy("output_ids")
    finally:
        client.close()


def shm_regions() -> set[str]:
    """Names of Python-backend shared-memory regions that exist now."""
    return {p.name for p in SHM_DIR.glob(f"{SHM_PREFIX}*")}


def home_shm_prefixes(home: Path) -> tuple[str, ...]:
    """Shared-memory prefixes of the servers started with this FTX_HOME (from their logs' command lines),
    so a test judges only its own servers' regions, not those of other test runs on the machine."""
    import re

    found = set()
    for log in (home / "triton" / "logs").glob("*.log"):
        found.update(re.findall(r"shm-region-prefix-name=(\S+)", log.read_text(errors="replace")))
    return tuple(sorted(found))


def process_gone(pid: int | None) -> bool:
    """True if neither ``pid`` nor any process of its group runs (zombies awaiting reaping count as gone)."""
    assert pid is not None
    for proc in Path("/proc").glob("[0-9]*"):
        fields = stat_fields(int(proc.name))
        if fields and fields[0] not in ("Z", "X") and (proc.name == str(pid) or fields[2] == str(pid)):
            return False
    return True


def command_lines() -> list[str]:
    """The command line of every running process, its arguments joined by spaces (processes that end while they
    are read are left out)."""
    lines = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            lines.append(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return lines


def python_child(code: str, *args: str) -> subprocess.Popen[str]:
    """A child Python running ``code`` with ``args``, ftx's sources on its path, its stdin and stdout piped to the
    test (text) and its stderr dropped."""
    import ftx_triton

    src = str(Path(ftx_triton.__file__).parents[1])
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": src},
    )
