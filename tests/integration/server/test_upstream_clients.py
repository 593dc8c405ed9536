"""fastertransformer_backend's own clients, unchanged in what they send, against ftx's python runtime.

Each client's calls are written here with tritonclient the way the client makes them (model name,
input names, dtypes, shapes, options; no network): ``tools/issue_request.py`` with the request
files (ours, in their shapes: ``tests/ft_requests/``), ``tools/gpt/identity_test.py`` (the fixed
batch of 8, and ``-r -b 32`` as the guides run it), ``tools/gpt/evaluate_lambada.py`` (batch
128 by default), ``tools/t5_utils/t5_end_to_end_test.py`` and the ensemble call of
``tools/end_to_end_test.py``. Every family (GPT-J, KoGPT, GPT-NeoX, T5), HTTP and gRPC; streaming
over gRPC as upstream streams. The whole repository comes from ftx's pipeline with its defaults.
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
from python_runtime_support import (
    BUILDERS,
    SERVER_MARKS,
    T5_REFERENCES,
    T5_SENTENCES,
    build_repository,
    hf_greedy,
    reference_model,
    registered_families,
)

pytestmark = SERVER_MARKS

FAMILIES = registered_families()
DECODERS = sorted(n for n, f in FAMILIES.items() if f.triton_io == "decoder")
REQUESTS = Path(__file__).parent / "ft_requests"
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


class Client:
    """One protocol's client for a served deployment (closed after each call, as upstream's `with`)."""

    def __init__(self, protocol: str, deployment: Deployment) -> None:
        self.protocol = protocol
        self.url = deployment.server.http_url if protocol == "http" else deployment.server.grpc_url

    def infer(self, model: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        module = _module(self.protocol)
        if self.protocol == "http":
            kwargs: dict[str, Any] = {"concurrency": 10, "network_timeout": 300.0, "connection_timeout": 300.0}
            call: dict[str, Any] = {}
        else:
            kwargs, call = {}, {"client_timeout": 300}
        with module.InferenceServerClient(self.url, **kwargs) as client:
            result = client.infer(model, [prepare_tensor(self.protocol, n, v) for n, v in arrays.items()], **call)
        response = result.get_response()
        names = [o["name"] for o in response["outputs"]] if self.protocol == "http" else \
            [o.name for o in response.outputs]
        return {name: result.as_numpy(name) for name in names}


def grpc_stream(url: str, model: str, arrays: dict[str, np.ndarray], timeout_s: float = 300) -> list[dict]:
    """issue_request.py's stream: every response's outputs, in order, until the final one."""
    import tritonclient.grpc as grpcclient

    got: queue.Queue = queue.Queue()
    responses = []
    with grpcclient.InferenceServerClient(url) as client:
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        client.async_stream_infer(model, [prepare_tensor("grpc", n, v) for n, v in arrays.items()],
                                  enable_empty_final_response=True)
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
    out = {}
    for name in FAMILIES:
        src = BUILDERS[name](tmp_path_factory.mktemp(f"up-src-{name}") / "hf")
        out[name] = (src, reference_model(src))
    return out


def _deploy(name: str, sources: dict[str, tuple[Path, Any]], home: Path, **settings: Any) -> Iterator[Deployment]:
    from ftx_triton.server.tritonserver import TritonServer

    src, ref = sources[name]
    repository = build_repository(src, home, name, 1, **settings)
    with TritonServer(repository.path, home=home, env={"FTX_DEVICE": "cpu"}, name=f"up-{name}") as server:
        yield Deployment(name, src, ref, server)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def served(request: pytest.FixtureRequest, sources: dict[str, tuple[Path, Any]],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """A family's repository with ftx's defaults (max_batch_size included), served."""
    yield from _deploy(request.param, sources, tmp_path_factory.mktemp(f"up-home-{request.param}"))


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def streamed(request: pytest.FixtureRequest, sources: dict[str, tuple[Path, Any]],
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """The same with --streaming (decoupled fastertransformer model)."""
    yield from _deploy(request.param, sources, tmp_path_factory.mktemp(f"up-shome-{request.param}"), streaming=True)


def _tokens(out: dict[str, np.ndarray], b: int, k: int = 0) -> list[int]:
    return out["output_ids"][b, k, : out["sequence_length"][b, k]].tolist()


# --------------------------------------------------------------------------- tools/issue_request.py


def _check_issue_request_answer(deployment: Deployment, arrays: dict[str, np.ndarray], out: dict[str, np.ndarray],
                                sampled: bool) -> None:
    ids = arrays["input_ids"]
    batch = ids.shape[0]
    assert {"output_ids", "sequence_length", "cum_log_probs", "output_log_probs"} <= set(out)
    assert out["cum_log_probs"].shape == (batch, 1) and (out["cum_log_probs"] < 0).all()
    if deployment.encoder_decoder:
        n = int(arrays["max_output_len"][0, 0])
        assert out["output_ids"].shape == (batch, 1, n) and out["output_ids"].dtype == np.int32
        if not sampled:
            assert _tokens(out, 0) == deployment.greedy(ids[0].tolist(), n)
        return
    n = int(arrays["request_output_len"][0, 0])
    assert out["output_ids"].shape == (batch, 1, ids.shape[1] + n) and out["output_ids"].dtype == np.uint32
    assert out["output_log_probs"].shape == (batch, 1, n)
    assert (out["sequence_length"] == ids.shape[1] + n).all()  # end id 50256 is never generated
    for b in range(batch):
        assert out["output_ids"][b, 0, : ids.shape[1]].tolist() == ids[b].tolist()
    if not sampled:
        for b in {0, min(2, batch - 1)}:
            assert _tokens(out, b) == deployment.greedy(ids[b].tolist(), n, eos_token_id=None), b


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_issue_request_with_the_sample_request_files(served: Deployment, protocol: str) -> None:
    files = ("sample_request_single_t5.json", "sample_request_single_t5_ia3.json") if served.encoder_decoder else (
        "sample_request.json", "sample_request_single.json", "sample_request_runtime_top_k.json")
    for name in files:
        config, arrays = request_file(name)
        out = Client(protocol, served).infer(config["model_name"], arrays)
        _check_issue_request_answer(served, arrays, out, sampled=int(arrays["runtime_top_k"][0, 0]) > 1)


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


# --------------------------------------------------------------------------- tools/gpt/identity_test.py


def identity_inputs(start_ids: np.ndarray, output_len: int, beam_width: int = 1, topk: int = 1) -> dict:
    batch = start_ids.shape[0]
    ones = np.ones([batch, 1])
    no_words = np.concatenate([np.zeros([batch, 1, 1]).astype(np.int32), (-1 * np.ones([batch, 1, 1])).astype(np.int32)],
                              axis=1)
    return {
        "input_ids": start_ids,
        "input_lengths": np.array([[s.size] for s in start_ids], np.uint32),
        "request_output_len": (ones * output_len).astype(np.uint32),
        "runtime_top_k": (topk * ones).astype(np.uint32),
        "runtime_top_p": 0.0 * ones.astype(np.float32),
        "beam_search_diversity_rate": 0.0 * ones.astype(np.float32),
        "temperature": 1.0 * ones.astype(np.float32),
        "len_penalty": 1.0 * ones.astype(np.float32),
        "repetition_penalty": 1.0 * ones.astype(np.float32),
        "random_seed": 0 * ones.astype(np.uint64),
        "is_return_log_probs": True * ones.astype(np.bool_),
        "beam_width": (beam_width * ones).astype(np.uint32),
        "start_id": GPT2_END_ID * ones.astype(np.uint32),
        "end_id": GPT2_END_ID * ones.astype(np.uint32),
        "bad_words_list": no_words,
        "stop_words_list": no_words.copy(),
    }


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_identity_test_fixed_batch_and_random_batch_of_32(served: Deployment, protocol: str) -> None:
    if served.encoder_decoder:
        pytest.skip("identity_test.py drives GPT models")
    _config, arrays = request_file("sample_request.json")
    client = Client(protocol, served)
    fixed = identity_inputs(arrays["input_ids"], 24)
    results = [client.infer("fastertransformer", fixed) for _ in range(2)]  # request_parallelism, smaller
    assert np.array_equal(results[0]["output_ids"], results[1]["output_ids"])
    _check_issue_request_answer(served, fixed, results[0], sampled=False)
    vocab = int(served.ref.config.vocab_size)
    random_ids = np.random.default_rng(0).integers(0, vocab, size=(32, 8), dtype=np.uint32)  # -r -b 32
    out = client.infer("fastertransformer", identity_inputs(random_ids, 24))
    assert out["output_ids"].shape == (32, 1, 32)
    assert _tokens(out, 31) == served.greedy(random_ids[31].tolist(), 24, eos_token_id=None)
    beams = client.infer("fastertransformer", identity_inputs(arrays["input_ids"][:2], 6, beam_width=2))
    assert beams["output_ids"].shape == (2, 2, 8 + 6)


# --------------------------------------------------------------------------- tools/gpt/evaluate_lambada.py


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_evaluate_lambada_batch(served: Deployment, protocol: str) -> None:
    """Contexts padded with END_ID (50256, beyond a tiny vocabulary: FT ignores padding), one
    token each, in one batch of 40 (the tool's batch is 128: the default max_batch_size takes it)."""
    if served.encoder_decoder:
        pytest.skip("evaluate_lambada.py drives GPT models")
    from ftx_triton.fetching.tiny import CORPUS

    sentences = [s.strip() + "." for s in CORPUS.split(".") if len(s.split()) > 3]
    samples = [served.codec.encode(s, prompt=False) for s in (sentences * 40)[:40]]
    context = [ids[:-1] for ids in samples]
    width = max(len(c) for c in context)
    padded = np.full((len(context), width), GPT2_END_ID, np.uint32)
    for i, c in enumerate(context):
        padded[i, : len(c)] = c
    input_len = np.array([[len(c)] for c in context], np.uint32)
    out = Client(protocol, served).infer("fastertransformer", {
        **identity_inputs(padded, 1), "input_lengths": input_len,
        "request_output_len": np.ones_like(input_len)})
    generated = [out["output_ids"][i][0][input_len[i, 0]] for i in range(len(context))]
    for i in (0, 1, 39):
        assert generated[i] == served.greedy(context[i], 1, eos_token_id=None)[-1], i


# --------------------------------------------------------------------------- tools/t5_utils/t5_end_to_end_test.py


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_t5_end_to_end_translation(served: Deployment, protocol: str) -> None:
    if not served.encoder_decoder:
        pytest.skip("t5_end_to_end_test.py drives T5")
    import sacrebleu

    encoded = [served.codec.encode(s, prompt=True) for s in T5_SENTENCES]
    width = max(len(e) for e in encoded)
    input_ids = np.zeros((len(encoded), width), np.uint32)  # padding=True with T5's pad id 0
    for i, e in enumerate(encoded):
        input_ids[i, : len(e)] = e
    batch = input_ids.shape[0]
    ones = np.ones([batch, 1])
    arrays = {
        "input_ids": input_ids,
        "sequence_length": np.array([[len(e)] for e in encoded], np.uint32),
        "runtime_top_k": ones.astype(np.uint32), "runtime_top_p": 0.0 * ones.astype(np.float32),
        "beam_search_diversity_rate": 0.0 * ones.astype(np.float32), "temperature": ones.astype(np.float32),
        "len_penalty": 0.0 * ones.astype(np.float32), "repetition_penalty": ones.astype(np.float32),
        "random_seed": 0 * ones.astype(np.uint64), "is_return_log_probs": True * ones.astype(bool),
        "max_output_len": (128 * ones).astype(np.uint32), "beam_width": ones.astype(np.uint32),
        "start_id": 0 * ones.astype(np.uint32), "end_id": ones.astype(np.uint32),
        "bad_words_list": np.array([[[0], [-1]]] * batch, dtype=np.int32),
        "stop_words_list": np.array([[[0], [-1]]] * batch, dtype=np.int32),
    }
    out = Client(protocol, served).infer("fastertransformer", arrays)
    texts = [served.codec.decode(out["output_ids"][j][0][: out["sequence_length"][j][0]]) for j in range(batch)]
    expected = [served.codec.decode(served.greedy(e, 128)) for e in encoded]
    assert texts == expected
    assert 0.0 <= sacrebleu.corpus_bleu(texts, [list(T5_REFERENCES)], force=True).score <= 100.0


# --------------------------------------------------------------------------- tools/end_to_end_test.py (ensemble)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_fastertransformer_ensemble_request(served: Deployment, protocol: str) -> None:
    """sample_request_ensemble.json / end_to_end_test.py's ensemble call: INPUT_0..INPUT_3 and FT's
    sampling inputs in; OUTPUT_0 (prompt + generation), sequence_length and log probs out."""
    config, arrays = request_file("sample_request_ensemble.json")
    if served.encoder_decoder:
        arrays["start_id"], arrays["end_id"] = np.zeros((8, 1), np.uint32), np.ones((8, 1), np.uint32)
    out = Client(protocol, served).infer(config["model_name"], arrays)
    assert {"OUTPUT_0", "sequence_length", "cum_log_probs", "output_log_probs"} <= set(out)
    assert out["OUTPUT_0"].shape == (8, 1) and out["output_log_probs"].shape[:2] == (8, 1)
    assert (out["cum_log_probs"] < 0).all()
    for b in (2, 3, 4):  # rows without bad or stop words
        prompt = arrays["INPUT_0"][b, 0]
        ids = served.codec.encode(prompt, prompt=True)
        if served.encoder_decoder:
            expected = served.codec.decode(served.greedy(ids, 24))
        else:
            expected = served.codec.decode(served.greedy(ids, 24, eos_token_id=None))
            assert out["OUTPUT_0"][b, 0].decode().startswith(prompt)
            assert out["sequence_length"][b, 0] == len(ids) + 24
        assert out["OUTPUT_0"][b, 0].decode() == expected, b


# --------------------------------------------------------------------------- the generate ensemble, streaming (#16.2)


def _generate_stream(url: str, body: dict[str, Any]) -> list[str]:
    request = urllib.request.Request(f"http://{url}/v2/models/text/generate_stream",
                                     data=json.dumps(body).encode(), method="POST")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=300) as response:
        lines = response.read().decode().splitlines()
    return [json.loads(line[len("data: "):])["text_output"] for line in lines if line.startswith("data: ")]


def test_generate_stream_sends_each_piece_of_text_once(streamed: Deployment) -> None:
    """POST generate_stream (what genai-perf reads): the pieces join to the generated text, with
    neither the prompt nor earlier text repeated; FT's ensemble still answers each step in full."""
    prompt = "The quick brown fox"
    ids = streamed.codec.encode(prompt, prompt=True)
    generated = streamed.greedy(ids, 12)
    if not streamed.encoder_decoder:
        generated = generated[len(ids):]
    end = streamed.ref.config.eos_token_id
    expected = streamed.codec.decode(generated[: generated.index(end)] if end in generated else generated)
    expected = expected.rstrip("\ufffd")  # a character cut off by max_tokens is not sent
    pieces = _generate_stream(streamed.server.http_url, {"text_input": prompt, "max_tokens": 12, "stream": True})
    assert "".join(pieces) == expected
    assert len(pieces) == len(generated) and sum(len(p) for p in pieces) == len(expected)
    if not streamed.encoder_decoder:
        assert not any(p.startswith(prompt) for p in pieces if p)
    from ftx_triton.cli.serving import generate_text

    printed: list[str] = []
    text = generate_text(streamed.server.grpc_url, "text", prompt, max_tokens=12, stream=True,
                         on_text=printed.append)
    assert text == ("" if streamed.encoder_decoder else prompt) + expected == "".join(printed)
    config, arrays = request_file("sample_request_ensemble.json")
    if streamed.encoder_decoder:
        arrays["start_id"], arrays["end_id"] = np.zeros((8, 1), np.uint32), np.ones((8, 1), np.uint32)
    steps = grpc_stream(streamed.server.grpc_url, config["model_name"], {k: v[:1] for k, v in arrays.items()})
    texts = [s["OUTPUT_0"][0, 0].decode() for s in steps]
    assert len(steps) > 1 and all(b.startswith(a) for a, b in itertools.pairwise(texts))
