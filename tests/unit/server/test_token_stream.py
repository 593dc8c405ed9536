"""The token route's pieces: incremental detokenizing, Triton's gRPC messages, overload detection (no server)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest
from ftx_triton.client.token_stream import (
    IncrementalText,
    ModelRefused,
    Overloaded,
    StreamFault,
    infer_request,
    is_overload,
    read_response,
)
from ftx_triton.repository.textproc import load_codec

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _pieces(codec: object, context: list[int], ids: list[int], jumps: list[int]) -> list[str]:
    """Feed ``ids`` to an IncrementalText in steps of the given sizes (a slow reader skips responses)."""
    text = IncrementalText(codec, context)
    out, seen, k = [], 0, 0
    while seen < len(ids):
        seen = min(len(ids), seen + jumps[k % len(jumps)])
        k += 1
        out.append(text.update(ids[:seen]))
    out.append(text.finish())
    return out


@pytest.mark.parametrize("jumps", [[1], [3], [1, 7, 2]])
def test_hf_pieces_join_to_the_whole_decode_whatever_responses_are_skipped(built_demo: Path, jumps: list[int]) -> None:
    """DecodeStream primed with the prompt: the pieces read exactly as the generated ids decode at once, also
    when a reader takes several new ids at a time (stale responses dropped), and multi-byte characters
    split over ids come out whole."""
    codec = load_codec(built_demo)
    prompt = codec.encode("Once upon a time", prompt=True)
    rng = random.Random(7)
    for _ in range(20):
        ids = codec.encode("é café naïve 東京 — ok " * 3, prompt=False)
        ids = ids + [rng.randrange(codec.vocab_size) for _ in range(40)]
        joined = "".join(_pieces(codec, prompt, ids, jumps))
        assert joined == codec.decode(ids)


def test_sentencepiece_pieces_keep_their_spaces(tmp_path: Path) -> None:
    from python_runtime_support import train_t5_spiece

    train_t5_spiece(tmp_path)
    codec = load_codec(tmp_path)
    ids = codec.encode("the quick brown fox jumps over the lazy dog", prompt=False)
    for jumps in ([1], [2, 5]):
        assert "".join(_pieces(codec, [], ids, jumps)) == codec.decode(ids)


def test_request_and_response_messages_round_trip() -> None:
    from tritonclient.grpc import service_pb2

    tensors = {
        "input_ids": np.array([[5, 6, 7]], np.uint32),
        "input_lengths": np.array([[3]], np.uint32),
        "runtime_top_p": np.array([[0.5]], np.float32),
        "random_seed": np.array([[9]], np.uint64),
    }
    request = infer_request(tensors)
    assert request.model_name == "fastertransformer"
    assert [(i.name, i.datatype, list(i.shape)) for i in request.inputs] == [
        ("input_ids", "UINT32", [1, 3]),
        ("input_lengths", "UINT32", [1, 1]),
        ("runtime_top_p", "FP32", [1, 1]),
        ("random_seed", "UINT64", [1, 1]),
    ]
    assert request.parameters["triton_enable_empty_final_response"].bool_param
    message = service_pb2.ModelStreamInferResponse()
    out = message.infer_response
    ids = np.arange(12, dtype=np.uint32).reshape(1, 1, 12)
    out.outputs.add(name="output_ids", datatype="UINT32", shape=[1, 1, 12])
    out.raw_output_contents.append(ids.tobytes())
    outputs, final = read_response(message)
    assert (outputs["output_ids"] == ids).all() and not final
    out.parameters["triton_final_response"].bool_param = True
    assert read_response(message)[1]


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("Exceeds maximum queue size", Overloaded),
        ("Request timeout expired", Overloaded),
        ("generation failed: RuntimeError: CUDA out of memory", StreamFault),
        ("request_output_len 5000 exceeds the limit of 4096 tokens", ModelRefused),
    ],
)
def test_stream_errors_are_told_apart(message: str, kind: type) -> None:
    from tritonclient.grpc import service_pb2

    with pytest.raises(kind):
        read_response(service_pb2.ModelStreamInferResponse(error_message=message))
    assert is_overload(message) == (kind is Overloaded)
