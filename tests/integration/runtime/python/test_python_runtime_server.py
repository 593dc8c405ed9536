"""The python runtime's ``fastertransformer`` model on the real tritonserver (nvidia-pytriton wheel).

For every registered family (GPT-J, KoGPT-shaped, GPT-NeoX, T5) converted at tp 1 and tp 2:
greedy output through the server equals ``transformers`` on the original checkpoint; requests
shaped like FasterTransformer's identity client get the documented shapes and dtypes; malformed
requests get Triton errors and the server keeps serving; concurrent requests of different
lengths batch correctly; a decoupled model streams one response per token.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from python_runtime_support import (
    SERVER_MARKS,
    T5_REFERENCES,
    T5_SENTENCES,
    column,
    convert,
    decoder_inputs,
    family_tp_cases,
    ft_only_repository,
    hf_greedy,
    infer,
    registered_families,
    stream,
    t5_inputs,
    tiny_sources,
)

pytestmark = SERVER_MARKS

FAMILIES = registered_families()
CASES = family_tp_cases(FAMILIES)
PROMPTS = ([5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [20, 21, 22, 23, 24])
MAX_BATCH = 4


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    return tiny_sources(tmp_path_factory, FAMILIES, "src")


class Served:
    """A running server with the python runtime's fastertransformer model of one family and tp."""

    def __init__(self, name: str, tp: int, url: str, grpc_url: str, src: Path, ref: Any, server: Any) -> None:
        self.name, self.tp, self.url, self.grpc_url, self.src, self.ref, self.server = (
            name,
            tp,
            url,
            grpc_url,
            src,
            ref,
            server,
        )
        self.family = FAMILIES[name]
        self.encoder_decoder = self.family.triton_io == "encoder-decoder"

    def inputs(self, prompts: Any, n: int, **extra: Any) -> dict[str, np.ndarray]:
        return t5_inputs(prompts, n, **extra) if self.encoder_decoder else decoder_inputs(prompts, n, **extra)


def _start(
    tmp: Path, name: str, tp: int, src: Path, ref: Any, env: dict[str, str] | None = None, **repo_kwargs: Any
) -> Any:
    from ftx_triton.server.tritonserver import TritonServer

    family = FAMILIES[name]
    ckpt = convert(family, src, tmp / "ft", tp)
    repo = ft_only_repository(tmp / "repo", family, ckpt, tp, **repo_kwargs)
    server = TritonServer(repo, home=tmp / "home", env={"FTX_DEVICE": "cpu", **(env or {})}, name=f"rt-{name}-{tp}")
    server.start()
    return server


@pytest.fixture(scope="module", params=CASES, ids=[f"{n}-tp{tp}" for n, tp in CASES])
def served(
    request: pytest.FixtureRequest, sources: dict[str, tuple[Path, Any]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    name, tp = request.param
    src, ref = sources[name]
    server = _start(tmp_path_factory.mktemp(f"srv-{name}-{tp}"), name, tp, src, ref, max_batch_size=MAX_BATCH)
    try:
        yield Served(name, tp, server.http_url, server.grpc_url, src, ref, server)
    finally:
        server.stop()


def _tokens(out: dict[str, np.ndarray], b: int, k: int = 0) -> list[int]:
    return out["output_ids"][b, k, : out["sequence_length"][b, k]].tolist()


def test_greedy_output_equals_transformers_on_the_original_checkpoint(served: Served) -> None:
    out = infer(served.url, served.inputs(PROMPTS, 10))
    for b, prompt in enumerate(PROMPTS):
        assert _tokens(out, b) == hf_greedy(served.ref, prompt, 10), (served.name, served.tp, b)


def test_identity_client_request_gets_documented_shapes_and_dtypes(served: Served) -> None:
    batch, out_len = 3, 6
    extra = {
        "runtime_top_k": column(1, batch, np.uint32),
        "runtime_top_p": column(0.0, batch, np.float32),
        "temperature": column(1.0, batch, np.float32),
        "len_penalty": column(0.0, batch, np.float32),
        "repetition_penalty": column(1.0, batch, np.float32),
        "random_seed": column(0, batch, np.uint64),
        "beam_width": column(1, batch, np.uint32),
        "is_return_log_probs": column(True, batch, np.bool_),
        "bad_words_list": np.tile(np.array([[[0], [-1]]], np.int32), (batch, 1, 1)),
        "stop_words_list": np.tile(np.array([[[0], [-1]]], np.int32), (batch, 1, 1)),
    }
    names = ("output_ids", "sequence_length", "cum_log_probs", "output_log_probs")
    out = infer(served.url, served.inputs(PROMPTS, out_len, **extra), outputs=names)
    width = max(len(p) for p in PROMPTS)
    if served.encoder_decoder:  # T5: decoder tokens only, INT32
        assert (out["output_ids"].dtype, out["output_ids"].shape) == (np.int32, (batch, 1, out_len))
        assert (out["sequence_length"].dtype, out["sequence_length"].shape) == (np.int32, (batch, 1))
        assert (out["sequence_length"] <= out_len).all()
    else:  # output_ids include the prompt
        assert (out["output_ids"].dtype, out["output_ids"].shape) == (np.uint32, (batch, 1, width + out_len))
        # as FasterTransformer returns them: INT32 lengths from GPT-J (and KoGPT), UINT32 from GPT-NeoX
        lengths = np.uint32 if served.family.triton_model_type == "GPT-NeoX" else np.int32
        assert (out["sequence_length"].dtype, out["sequence_length"].shape) == (lengths, (batch, 1))
        for b, prompt in enumerate(PROMPTS):
            assert out["output_ids"][b, 0, : len(prompt)].tolist() == list(prompt)
            assert len(prompt) < out["sequence_length"][b, 0] <= len(prompt) + out_len
    assert (out["cum_log_probs"].dtype, out["cum_log_probs"].shape) == (np.float32, (batch, 1))
    assert (out["output_log_probs"].dtype, out["output_log_probs"].shape) == (np.float32, (batch, 1, out_len))
    assert (out["cum_log_probs"] < 0).all()


def test_beam_search_returns_beam_width_sequences(served: Served) -> None:
    out = infer(served.url, served.inputs(PROMPTS[:2], 5, beam_width=column(2, 2, np.uint32)))
    assert out["output_ids"].shape[:2] == (2, 2)
    assert out["sequence_length"].shape == (2, 2)


def test_malformed_requests_get_errors_and_the_server_keeps_serving(served: Served) -> None:
    from tritonclient.utils import InferenceServerException

    good = served.inputs(PROMPTS[:1], 4)
    length_name = "sequence_length" if served.encoder_decoder else "input_lengths"
    out_name = "max_output_len" if served.encoder_decoder else "request_output_len"
    bad_requests = {
        "wrong dtype": ({**good, "input_ids": good["input_ids"].astype(np.int32)}, "data-type|datatype|INT32"),
        "batch over the max": (served.inputs([PROMPTS[1]] * (MAX_BATCH + 1), 4), "batch"),
        "huge output length": ({**good, out_name: np.full_like(good[out_name], 2**32 - 1)}, "exceeds"),
        "zero output length": ({**good, out_name: np.zeros_like(good[out_name])}, "at least 1"),
        "empty prompt": ({**good, length_name: np.zeros_like(good[length_name])}, "at least 1"),
        "token outside the vocabulary": ({**good, "input_ids": np.full_like(good["input_ids"], 10**6)}, "vocabulary"),
    }
    expected = infer(served.url, good)
    for what, (inputs, message) in bad_requests.items():
        with pytest.raises(InferenceServerException, match=message):
            infer(served.url, inputs)
        again = infer(served.url, good)  # the server still answers, with the same tokens
        assert np.array_equal(again["output_ids"], expected["output_ids"]), what


def test_concurrent_requests_of_different_lengths_each_get_their_own_answer(served: Served) -> None:
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[1][:2]]
    results: dict[int, Any] = {}

    def one(i: int) -> None:
        results[i] = infer(served.url, served.inputs([prompts[i]], 3 + i))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for i, prompt in enumerate(prompts):
        assert _tokens(results[i], 0) == hf_greedy(served.ref, prompt, 3 + i), i


@pytest.mark.skipif("t5" not in FAMILIES, reason="the t5 family is not registered")
def test_t5_translation_pipeline_tokenize_serve_decode_score(
    sources: dict[str, tuple[Path, Any]], tmp_path: Path
) -> None:
    """FasterTransformer's t5_end_to_end_test, offline: sentencepiece tokens in, BLEU out."""
    import sacrebleu
    import sentencepiece as spm

    src, ref = sources["t5"]
    processor = spm.SentencePieceProcessor()
    processor.Load(str(src / "spiece.model"))
    prompts = [processor.EncodeAsIds(s) + [processor.eos_id()] for s in T5_SENTENCES]
    server = _start(tmp_path, "t5", 2, src, ref)
    try:
        out = infer(
            server.http_url,
            t5_inputs(
                prompts, 16, start_id=column(0, len(prompts), np.uint32), end_id=column(1, len(prompts), np.uint32)
            ),
        )
    finally:
        server.stop()
    hypotheses = [processor.DecodeIds([t for t in _tokens(out, b) if t > 2]) for b in range(len(prompts))]
    expected = [processor.DecodeIds([t for t in hf_greedy(ref, p, 16) if t > 2]) for p in prompts]
    assert hypotheses == expected
    assert sacrebleu.corpus_bleu(hypotheses, [expected]).score == pytest.approx(100.0) or not any(expected)
    score = sacrebleu.corpus_bleu(hypotheses, [list(T5_REFERENCES)]).score  # a tiny random model: any score
    assert 0.0 <= score <= 100.0


def test_decoupled_model_streams_one_response_per_token(sources: dict[str, tuple[Path, Any]], tmp_path: Path) -> None:
    name = "gptj"
    src, ref = sources[name]
    server = _start(tmp_path, name, 1, src, ref, streaming=True)
    try:
        no_eos = {"end_id": column(10_000, 1, np.uint32)}
        responses = stream(server.grpc_url, decoder_inputs([PROMPTS[0]], 6, **no_eos))
        ids_then = stream(server.grpc_url, decoder_inputs([PROMPTS[1]], 2, **no_eos))
    finally:
        server.stop()
    assert [final for _data, final in responses] == [False] * 5 + [True]
    expected = hf_greedy(ref, PROMPTS[0], 6, eos_token_id=None)
    for step, (data, _final) in enumerate(responses, start=1):
        assert data["output_ids"].shape == (1, 1, len(PROMPTS[0]) + step)
        assert _tokens(data, 0) == expected[: len(PROMPTS[0]) + step]
    assert [final for _data, final in ids_then] == [False, True]


def test_stream_interval_sends_every_nth_step_and_the_bounded_queue_refuses_at_once(
    sources: dict[str, tuple[Path, Any]], tmp_path: Path
) -> None:
    """``ftx_stream_interval`` 3: replies at steps 1, 3 and 6 and the final one, each holding every token so far.
    ``max_queue_size`` 1: while one request generates and one waits, a third is refused at once with Triton's
    own error (admission control), and the queued one is refused once it waited past ``queue_timeout_ms``."""
    import time

    name = "gptj"
    src, ref = sources[name]
    server = _start(
        tmp_path, name, 1, src, ref, streaming=True, stream_interval=3, max_queue_size=1, queue_timeout_ms=200
    )
    no_eos = {"end_id": column(10_000, 1, np.uint32)}
    outcome: dict[str, tuple[float, float, str]] = {}  # key -> (started, ended, "ok" or the error)
    generating = threading.Event()

    def call(key: str, prompt: list[int], n: int) -> None:
        began = time.monotonic()
        try:
            stream(server.grpc_url, decoder_inputs([prompt], n, **no_eos), on_response=generating.set)
            outcome[key] = (began, time.monotonic(), "ok")
        except Exception as exc:  # noqa: BLE001 - the refusal is the result
            outcome[key] = (began, time.monotonic(), str(exc))

    try:
        responses = stream(server.grpc_url, decoder_inputs([PROMPTS[0]], 7, **no_eos))
        deadline = time.monotonic() + 60
        while True:  # on a loaded machine the last stream can hold the instance past the 200 ms queue timeout
            generating.clear()
            first = threading.Thread(target=call, args=("generating", PROMPTS[0], 240))
            first.start()
            while not generating.wait(0.1) and first.is_alive() and time.monotonic() < deadline:
                pass
            if generating.is_set() or time.monotonic() >= deadline:
                break
            first.join()
            assert "timeout" in outcome["generating"][2].lower(), outcome  # only a queue timeout is retried
        assert generating.is_set(), outcome  # its first reply came: it is generating now
        others = [threading.Thread(target=call, args=(k, PROMPTS[1], 4)) for k in ("second", "third")]
        for thread in others:
            thread.start()
        for thread in [first, *others]:
            thread.join(120)
    finally:
        server.stop()
    assert [final for _data, final in responses] == [False, False, False, True]
    expected = hf_greedy(ref, PROMPTS[0], 7, eos_token_id=None)
    for (data, _final), step in zip(responses, (1, 3, 6, 7), strict=True):
        assert _tokens(data, 0) == expected[: len(PROMPTS[0]) + step]
    assert outcome["generating"][2] == "ok", outcome
    refused = [k for k in ("second", "third") if "maximum queue size" in outcome[k][2]]
    assert refused, outcome  # two arrivals while one generates: the queue of one holds one of them at most
    full = refused[0]
    assert outcome[full][1] - outcome[full][0] < 1.0, outcome  # fast: no wait for the generation in progress
    queued = "third" if full == "second" else "second"
    if outcome["generating"][1] - outcome[queued][0] > 0.2 + 0.5:  # the queued one had time to time out
        assert "timeout" in outcome[queued][2].lower(), outcome


def test_auto_stream_interval_counts_the_requests_the_server_batches(
    sources: dict[str, tuple[Path, Any]], tmp_path: Path
) -> None:
    """``--stream-interval auto`` (the default, R = 4): five streams that Triton's dynamic batcher runs as one
    execution get the first step, every 2nd and the final reply (4 responses for 6 tokens, the last holding all);
    one request of five rows, alone, gets every step (6), as upstream's batch-of-8 identity client expects."""
    import json
    import urllib.request

    name = "gptj"
    src, ref = sources[name]
    # the batcher holds the first arrival up to 2 s for more and runs at once when five rows are there
    server = _start(tmp_path, name, 1, src, ref, streaming=True, max_batch_size=5, batch_delay_us=2_000_000)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(5)]
    got: dict[int, list[tuple[dict[str, np.ndarray], bool]]] = {}

    def one(index: int) -> None:
        got[index] = stream(server.grpc_url, decoder_inputs([prompts[index]], 6, end_id=column(10_000, 1, np.uint32)))

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the server is local

    def executions() -> int:
        with opener.open(f"http://{server.http_url}/v2/models/fastertransformer/stats", timeout=60) as answer:
            return int(json.loads(answer.read())["model_stats"][0]["execution_count"])

    try:
        before = executions()
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        # Triton counts an execution once execute() returns, which a stream's final reply can beat: wait for it
        deadline = time.monotonic() + 10
        while (batched := executions() - before) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        alone = stream(server.grpc_url, decoder_inputs(prompts, 6, end_id=column(10_000, 5, np.uint32)))
    finally:
        server.stop()
    assert batched == 1  # the five streams were one execution of the model
    for index, prompt in enumerate(prompts):
        assert [final for _data, final in got[index]] == [False, False, False, True], index
        assert [int(data["sequence_length"][0, 0]) for data, _final in got[index]] == [
            len(prompt) + s for s in (1, 2, 4, 6)
        ]
        assert _tokens(got[index][-1][0], 0) == hf_greedy(ref, prompt, 6, eos_token_id=None)
    assert [final for _data, final in alone] == [False] * 5 + [True]


def test_tensors_cross_the_stub_through_dlpack_too(sources: dict[str, tuple[Path, Any]], tmp_path: Path) -> None:
    """The DLPack exchange used under numpy 2 (where the stub's numpy bridge returns empty tensors)
    gives the same answers; FTX_TRITON_DLPACK=1 forces it here, under numpy 1."""
    src, ref = sources["gptj"]
    server = _start(tmp_path, "gptj", 1, src, ref, env={"FTX_TRITON_DLPACK": "1"})
    try:
        out = infer(server.http_url, decoder_inputs([PROMPTS[0]], 5))
    finally:
        server.stop()
    assert out["output_ids"].dtype == np.uint32 and out["sequence_length"].dtype == np.int32  # as GPT-J's FT model
    assert _tokens(out, 0) == hf_greedy(ref, PROMPTS[0], 5)
