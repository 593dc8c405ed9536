"""Malformed requests mixed into concurrent valid ones (#14.3): every valid request is answered
correctly, every malformed one is refused alone with 400 / INVALID_ARGUMENT (500 / INTERNAL for
the one that only fails inside generation), and the server keeps serving. Real tritonserver,
python runtime, tiny GPT-J; requests through the raw fastertransformer model (HTTP and gRPC),
the generate ensemble and the HTTP front."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from python_runtime_support import (
    BUILDERS,
    SERVER_MARKS,
    build_repository,
    column,
    decoder_inputs,
    hf_greedy,
    infer,
    reference_model,
)

pytestmark = SERVER_MARKS

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Deployment:
    def __init__(self, server: Any, ref: Any) -> None:
        self.server, self.ref = server, ref
        from ftx_triton.repository.textproc import load_codec

        self.codec = load_codec(Path(server.repository) / "preprocessing" / "1")
        self.positions = int(ref.config.n_positions)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    from ftx_triton.server.tritonserver import TritonServer

    src = BUILDERS["gptj"](tmp_path_factory.mktemp("hostile-src") / "hf")
    home = tmp_path_factory.mktemp("hostile-home")
    repository = build_repository(src, home, "gptj", 1)
    with TritonServer(repository.path, home=home, env={"FTX_DEVICE": "cpu"}, name="hostile") as server:
        yield Deployment(server, reference_model(src))


def _generate(url: str, body: bytes | dict[str, Any]) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{url}/v2/models/text/generate", data=data, method="POST")
    try:
        with _DIRECT.open(request, timeout=300) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _grpc_infer(url: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    with grpcclient.InferenceServerClient(url) as client:
        tensors = []
        for name, value in inputs.items():
            tensor = grpcclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
            tensor.set_data_from_numpy(value)
            tensors.append(tensor)
        result = client.infer("fastertransformer", tensors, client_timeout=300)
        return {n: result.as_numpy(n) for n in ("output_ids", "sequence_length")}


def _status(exc: Exception) -> str:
    """400 / 500 of an HTTP error, INVALID_ARGUMENT / INTERNAL of a gRPC one."""
    status = getattr(exc, "status", None)
    return str(status() if callable(status) else status)


def test_malformed_requests_fail_alone_among_concurrent_valid_ones(deployment: Deployment) -> None:
    from tritonclient.utils import InferenceServerException

    http, grpc = deployment.server.http_url, deployment.server.grpc_url
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, 200, size=int(rng.integers(2, 9))).tolist() for _ in range(40)]
    lengths = [int(n) for n in rng.integers(1, 7, size=40)]
    no_eos = column(10_000, 1, np.uint32)
    sample = {"runtime_top_p": np.array([[1.0]], np.float32)}
    near_limit = deployment.positions - 2  # 3 prompt tokens + this = one past the context

    def raw(change: dict[str, np.ndarray], n: int = 4) -> dict[str, np.ndarray]:
        return {**decoder_inputs([[5, 6, 7]], n), **change}

    # name -> (call, expected status): every one of these must be refused by itself
    bad: dict[str, tuple[Callable[[], Any], set[str]]] = {
        "temperature NaN (sampling)": (
            lambda: infer(http, raw({"temperature": np.array([[np.nan]], np.float32), **sample})),
            {"400"},
        ),
        "repetition_penalty NaN": (
            lambda: infer(http, raw({"repetition_penalty": np.array([[np.nan]], np.float32)})),
            {"400"},
        ),
        "len_penalty inf": (lambda: infer(http, raw({"len_penalty": np.array([[np.inf]], np.float32)})), {"400"}),
        "top_p NaN over gRPC": (
            lambda: _grpc_infer(grpc, raw({"runtime_top_p": np.array([[np.nan]], np.float32)})),
            {"StatusCode.INVALID_ARGUMENT"},
        ),
        "request_output_len 2^32-1": (lambda: infer(http, raw({}, 2**32 - 1)), {"400"}),
        "past the model's positions": (lambda: infer(http, raw({}, near_limit)), {"400"}),
        "token outside the vocabulary": (lambda: infer(http, {**decoder_inputs([[5, 6, 10**6]], 3)}), {"400"}),
        "runtime_top_k above the vocabulary": (
            lambda: infer(http, raw({"runtime_top_k": column(10**6, 1, np.uint32)})),
            {"400"},
        ),
        "broken stop word offsets": (
            lambda: infer(http, raw({"stop_words_list": np.array([[[1, 2], [5, -1]]], np.int32)})),
            {"400"},
        ),
        "repetition_penalty 1e-40 (sampling)": (
            lambda: infer(http, raw({"repetition_penalty": np.array([[1e-40]], np.float32), **sample})),
            {"400"},
        ),
        "len_penalty 1e30 (beam search)": (
            lambda: infer(
                http, raw({"len_penalty": np.array([[1e30]], np.float32), "beam_width": column(2, 1, np.uint32)})
            ),
            {"400"},
        ),
        "ensemble: invalid UTF-8": (
            lambda: _raise(_generate(http, b'{"text_input":"\xff\xfe","max_tokens":3}')),
            {"400"},
        ),
        "ensemble: max_tokens 2^32+5": (
            lambda: _raise(_generate(http, {"text_input": "Hi", "max_tokens": 2**32 + 5})),
            {"400"},
        ),
        "ensemble: temperature NaN": (
            lambda: _raise(_generate(http, b'{"text_input":"Hi","max_tokens":3,"temperature":NaN,"top_p":0.5}')),
            {"400"},
        ),
        "ensemble: a 1 MB prompt": (
            lambda: _raise(_generate(http, {"text_input": "ab " * 350_000, "max_tokens": 3})),
            {"400"},
        ),
        "ensemble: top_p 2": (
            lambda: _raise(_generate(http, {"text_input": "Hi", "max_tokens": 3, "top_p": 2.0})),
            {"400"},
        ),
        "front: JSON nested 1 000 000 deep": (
            lambda: _raise(_generate(http, b'{"text_input":' + b"[" * 10**6 + b"]" * 10**6 + b"}")),
            {"400"},
        ),
    }

    results: dict[str, Any] = {}

    def valid(i: int) -> None:
        call = _grpc_infer if i % 2 else infer
        results[i] = call(grpc if i % 2 else http, decoder_inputs([prompts[i]], lengths[i], end_id=no_eos))

    def malformed(name: str) -> None:
        try:
            bad[name][0]()
        except (InferenceServerException, _Refused) as exc:
            results[name] = _status(exc)
        else:
            results[name] = "answered"

    threads = [threading.Thread(target=valid, args=(i,)) for i in range(40)]
    threads += [threading.Thread(target=malformed, args=(name,)) for name in bad]
    order = np.random.default_rng(2).permutation(len(threads))
    for k in order:
        threads[k].start()
    for thread in threads:
        thread.join(timeout=600)
    handled = [name for name, (_call, expected) in bad.items() if results.get(name) in expected]
    assert handled == list(bad), {name: results.get(name) for name in bad if name not in handled}
    for i in range(40):
        out = results[i]
        tokens = out["output_ids"][0, 0, : out["sequence_length"][0, 0]].tolist()
        assert tokens == hf_greedy(deployment.ref, prompts[i], lengths[i], eos_token_id=None), i
    print(f"bad requests tried {len(bad)}, handled {len(handled)}; valid requests answered correctly 40/40")
    assert deployment.server.running
    assert _generate(http, {"text_input": "Hello", "max_tokens": 2})[0] == 200


class _Refused(Exception):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(body.get("error", ""))
        self.status = status


def _raise(answer: tuple[int, dict[str, Any]]) -> None:
    status, body = answer
    if status != 200:
        raise _Refused(status, body)


def test_an_upstream_word_list_over_the_csv_field_limit_is_the_clients_400(deployment: Deployment) -> None:
    """Issue 33: FasterTransformer's ensemble reads INPUT_2/INPUT_3 as CSV lines; a word over the CSV
    reader's 131 072-character field limit was the preprocessing model's fault (500)."""
    url = deployment.server.http_url

    def ensemble(bad_words: str) -> tuple[int, dict[str, Any]]:
        body = {
            "inputs": [
                {"name": "INPUT_0", "datatype": "BYTES", "shape": [1, 1], "data": ["Once upon a time"]},
                {"name": "INPUT_1", "datatype": "UINT32", "shape": [1, 1], "data": [2]},
                {"name": "INPUT_2", "datatype": "BYTES", "shape": [1, 1], "data": [bad_words]},
            ]
        }
        request = urllib.request.Request(
            f"http://{url}/v2/models/ensemble/infer", data=json.dumps(body).encode(), method="POST"
        )
        try:
            with _DIRECT.open(request, timeout=300) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    status, answer = ensemble('"' + "x" * 140_000 + '"')
    assert status == 400 and "INPUT_2" in answer["error"] and "131072" in answer["error"], (status, answer)
    status, answer = ensemble("time, upon")
    assert status == 200, answer
