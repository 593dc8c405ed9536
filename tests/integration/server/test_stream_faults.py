"""A streamed generation that fails is the server's fault, one the model refuses is the client's (issue 27:
a model yielding NaN was reported as a 400 blaming the client). Real tritonserver with a decoupled
Python-backend model that answers each prompt with the error ftx's models give: a refusal of the request,
or ``generation failed: RuntimeError: …`` (what sampling from NaN probabilities raises)."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

import pytest
from triton_helpers import model_files

pytestmark = pytest.mark.skipif(find_spec("pytriton") is None, reason="nvidia-pytriton is not installed")

ERRING = """
import triton_python_backend_utils as pb_utils

ERRORS = {
    "nan": "generation failed: RuntimeError: probability tensor contains either inf, nan or element < 0",
    "long": "prompt (3) + request_output_len (5000) = 5003 exceeds the model's 2048 positions",
}


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0].decode()
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(ERRORS[prompt])),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

CONFIG = """name: "erring"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
        { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""


def test_a_failed_generation_is_a_500_and_a_refusal_a_400(tmp_path: Path) -> None:
    from ftx_triton.client.text_client import HttpError, HttpTriton, text_interface
    from ftx_triton.server.tritonserver import TritonServer

    model_files(tmp_path / "repo", "erring", CONFIG, ERRING)
    with TritonServer(tmp_path / "repo", home=tmp_path / "home") as server:
        triton = HttpTriton(f"http://{server.http_url}")
        iface = text_interface(triton, "erring")
        assert iface.decoupled
        statuses = {}
        for prompt in ("nan", "long"):
            with pytest.raises(HttpError) as failed:
                list(triton.generate_stream(iface, {"prompt": prompt, "max_tokens": 4}))
            statuses[prompt] = failed.value.status
    assert statuses == {"nan": 500, "long": 400}
