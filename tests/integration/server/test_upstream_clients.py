"""fastertransformer_backend's streaming clients, as they stream, against ftx's --streaming deployments.

issue_request.py's stream (``sample_request_stream*.json``, gRPC): one response per step with its log
probs, checked step by step; and the ``text`` model's generate_stream (#16.2). Every family (GPT-J,
KoGPT, GPT-NeoX, T5). The scripts themselves run unchanged in ``test_upstream_scripts.py``.
"""

from __future__ import annotations

import itertools
import json
import queue
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from python_runtime_support import SERVER_MARKS, build_repository, hf_greedy, registered_families, tiny_sources
from repo_paths import TESTS

pytestmark = SERVER_MARKS

FAMILIES = registered_families()
DECODERS = sorted(n for n, f in FAMILIES.items() if f.triton_io == "decoder")
REQUESTS = TESTS / "ft_requests"
PROTOCOLS = ("http", "grpc")
GPT2_END_ID = 50256  # what GPT clients send as start/end id whatever the model: never generated here


# --------------------------------------------------------------------------- clients (tritonclient, as upstream)


def _module(protocol: str) -> Any:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    return httpclient if protocol == "http" else grpcclient


def prepare_tensor(protocol: str, name: str, value: np.ndarray) -> Any:
    """Upstream's prepare_tensor: the dtype from numpy through np_to_triton_dtype."""
    from tritonclient.utils import np_to_triton_dtype

    tensor = _module(protocol).InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
    tensor.set_data_from_numpy(value)
    return tensor


def grpc_stream(url: str, model: str, arrays: dict[str, np.ndarray], timeout_s: float = 300) -> list[dict]:
    """issue_request.py's stream: every response's outputs, in order, until the final one."""
    import tritonclient.grpc as grpcclient

    got: queue.Queue = queue.Queue()
    responses = []
    with grpcclient.InferenceServerClient(url) as client:
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        client.async_stream_infer(
            model, [prepare_tensor("grpc", n, v) for n, v in arrays.items()], enable_empty_final_response=True
        )
        while True:
            result, error = got.get(timeout=timeout_s)
            if error is not None:
                raise error
            response = result.get_response()
            data = {o.name: result.as_numpy(o.name) for o in response.outputs}
            if data:
                responses.append(data)
            if response.parameters["triton_final_response"].bool_param:
                client.stop_stream()
                return responses


def request_file(name: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """issue_request.py's reading of a request file: config (with its defaults) and numpy tensors."""
    body = json.loads((REQUESTS / name).read_text())
    config = {"protocol": "http", "model_name": "fastertransformer", "stream_api": False, **body.get("config", {})}
    return config, {r["name"]: np.array(r["data"], dtype=r["dtype"]) for r in body["request"]}


# --------------------------------------------------------------------------- deployments


class Deployment:
    def __init__(self, name: str, src: Path, ref: Any, server: Any) -> None:
        self.name, self.src, self.ref, self.server = name, src, ref, server
        self.encoder_decoder = FAMILIES[name].triton_io == "encoder-decoder"
        from ftx_triton.repository.textproc import load_codec

        self.codec = load_codec(Path(server.repository) / "preprocessing" / "1")

    def greedy(self, prompt: list[int], n: int, **kwargs: Any) -> list[int]:
        return hf_greedy(self.ref, prompt, n, **kwargs)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    return tiny_sources(tmp_path_factory, FAMILIES, "up-src")


def _deploy(name: str, sources: dict[str, tuple[Path, Any]], home: Path, **settings: Any) -> Iterator[Deployment]:
    from ftx_triton.server.tritonserver import TritonServer

    src, ref = sources[name]
    repository = build_repository(src, home, name, 1, **settings)
    with TritonServer(repository.path, home=home, env={"FTX_DEVICE": "cpu"}, name=f"up-{name}") as server:
        yield Deployment(name, src, ref, server)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def streamed(
    request: pytest.FixtureRequest, sources: dict[str, tuple[Path, Any]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    """The same with --streaming (decoupled fastertransformer model)."""
    yield from _deploy(request.param, sources, tmp_path_factory.mktemp(f"up-shome-{request.param}"), streaming=True)


def _tokens(out: dict[str, np.ndarray], b: int, k: int = 0) -> list[int]:
    return out["output_ids"][b, k, : out["sequence_length"][b, k]].tolist()


# --------------------------------------------------------------------------- tools/issue_request.py


def test_issue_request_streams_every_step_with_its_log_probs(streamed: Deployment) -> None:
    """sample_request_stream*.json over gRPC: one response per step, each with sequence_length,
    output_ids and cum_log_probs (what issue_request.py's stream consumer prints); #16.1."""
    name = "sample_request_stream_t5.json" if streamed.encoder_decoder else "sample_request_stream.json"
    config, arrays = request_file(name)
    assert config["protocol"] == "grpc" and config["stream_api"]
    responses = grpc_stream(streamed.server.grpc_url, config["model_name"], arrays)
    cum = [float(r["cum_log_probs"][0, 0]) for r in responses]
    assert all(c < 0 for c in cum) and cum == sorted(cum, reverse=True)  # each step adds a log prob < 0
    final = responses[-1]
    np.testing.assert_allclose(final["output_log_probs"][0, 0].sum(), final["cum_log_probs"][0, 0], rtol=1e-4)
    if streamed.encoder_decoder:
        n = int(arrays["max_output_len"][0, 0])
        expected = streamed.greedy(arrays["input_ids"][0].tolist(), n)
        assert _tokens(final, 0) == expected and len(responses) == len(expected)
    else:
        n = int(arrays["request_output_len"][0, 0])
        assert len(responses) == n
        prompt = arrays["input_ids"][0].tolist()
        assert _tokens(final, 0) == streamed.greedy(prompt, n, eos_token_id=None)
        for step, response in enumerate(responses, start=1):
            assert response["sequence_length"][0, 0] == len(prompt) + step


# --------------------------------------------------------------------------- the generate ensemble, streaming (#16.2)


def _generate_stream(url: str, body: dict[str, Any]) -> list[str]:
    request = urllib.request.Request(
        f"http://{url}/v2/models/text/generate_stream", data=json.dumps(body).encode(), method="POST"
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=300) as response:
        lines = response.read().decode().splitlines()
    return [json.loads(line[len("data: ") :])["text_output"] for line in lines if line.startswith("data: ")]


def test_generate_stream_sends_each_piece_of_text_once(streamed: Deployment) -> None:
    """POST generate_stream (what genai-perf reads): the pieces join to the generated text, with
    neither the prompt nor earlier text repeated; FT's ensemble still answers each step in full."""
    prompt = "The quick brown fox"
    ids = streamed.codec.encode(prompt, prompt=True)
    generated = streamed.greedy(ids, 12)
    if not streamed.encoder_decoder:
        generated = generated[len(ids) :]
    end = streamed.ref.config.eos_token_id
    expected = streamed.codec.decode(generated[: generated.index(end)] if end in generated else generated)
    expected = expected.rstrip("\ufffd")  # a character cut off by max_tokens is not sent
    pieces = _generate_stream(streamed.server.http_url, {"text_input": prompt, "max_tokens": 12, "stream": True})
    assert "".join(pieces) == expected
    assert len(pieces) == len(generated) and sum(len(p) for p in pieces) == len(expected)
    if not streamed.encoder_decoder:
        assert not any(p.startswith(prompt) for p in pieces if p)
    from ftx_triton.client.generate import generate_text

    printed: list[str] = []
    text = generate_text(streamed.server.grpc_url, "text", prompt, max_tokens=12, stream=True, on_text=printed.append)
    assert text == ("" if streamed.encoder_decoder else prompt) + expected == "".join(printed)
    config, arrays = request_file("sample_request_ensemble.json")
    if streamed.encoder_decoder:
        arrays["start_id"], arrays["end_id"] = np.zeros((8, 1), np.uint32), np.ones((8, 1), np.uint32)
    steps = grpc_stream(streamed.server.grpc_url, config["model_name"], {k: v[:1] for k, v in arrays.items()})
    texts = [s["OUTPUT_0"][0, 0].decode() for s in steps]
    assert len(steps) > 1 and all(b.startswith(a) for a, b in itertools.pairwise(texts))
