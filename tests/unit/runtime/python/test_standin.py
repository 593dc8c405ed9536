"""The benchmarks' STAND-IN ``fastertransformer`` model (``ftx_triton.runtime.python.standin``): the python runtime's
request checks and output tensors, a fixed wall time per execution whatever the batch, no CPU spent on it."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from ftx_triton.runtime.python.generation import DECODER, ModelLimits, build_outputs
from ftx_triton.runtime.python.standin import StandInGenerator
from ftx_triton.runtime.python.triton_model import FtModel
from python_runtime_support import decoder_inputs

LIMITS = ModelLimits(vocab_size=64, end_id=5, start_id=4, max_positions=256)
DTYPES = {"output_ids": np.uint32, "sequence_length": np.uint32, "cum_log_probs": np.float32}


def _model(seconds: float) -> FtModel:
    return FtModel(StandInGenerator(None, DECODER, None, LIMITS, execution_s=seconds), DTYPES)


def test_every_request_generates_its_whole_length_in_the_runtimes_output_layout() -> None:
    model = _model(0.0)
    prompts = [[7, 5, 9, 11], [12, 13]]
    replies = model.infer([decoder_inputs(prompts, [6, 3]), decoder_inputs([[1, 2, 3]], 2)])
    first, second = replies
    assert first.error is None and second.error is None
    assert first.outputs is not None and second.outputs is not None
    assert set(first.outputs) == set(DTYPES) and first.outputs["output_ids"].dtype == np.uint32
    lengths = first.outputs["sequence_length"].reshape(-1).tolist()
    assert lengths == [4 + 6, 2 + 3]  # prompt + request_output_len, as FasterTransformer counts
    row = first.outputs["output_ids"][0, 0].tolist()
    assert row[:4] == prompts[0] and row[4:10] == [9, 11, 7, 6, 9, 11]  # from the prompt's middle; end id 5 -> 6
    # the layout is the runtime's own (build_outputs), so the text models read it as they read the real model's
    expected = build_outputs(
        model.generator.parse(decoder_inputs([[1, 2, 3]], 2)),
        model.generator.run(model.generator.parse(decoder_inputs([[1, 2, 3]], 2)).items),
    )
    assert np.array_equal(second.outputs["output_ids"], expected["output_ids"].astype(np.uint32))


def test_a_bad_request_is_refused_as_the_runtime_refuses_it() -> None:
    (reply,) = _model(0.0).infer([decoder_inputs([[70, 1]], 4)])  # 70 is outside the vocabulary of 64
    assert reply.error is not None and reply.kind == "invalid"


@pytest.mark.parametrize("rows", [1, 32])
def test_an_execution_takes_its_wall_time_whatever_the_batch_and_no_cpu(rows: int) -> None:
    model = _model(0.3)
    batch = [decoder_inputs([[7, 8, 9]], 64) for _ in range(rows)]
    wall, cpu = time.monotonic(), time.process_time()
    model.infer(batch)
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    assert wall >= 0.3 and cpu < 0.15


def test_a_stream_sends_each_step_and_ends_final() -> None:
    sent: dict[int, list] = {}
    _model(0.05).stream([decoder_inputs([[7, 8, 9]], 4)], lambda i, reply: sent.setdefault(i, []).append(reply))
    replies = sent[0]
    assert len(replies) == 4 and replies[-1].final and not any(r.final for r in replies[:-1])
    assert replies[-1].outputs["sequence_length"].reshape(-1).tolist() == [3 + 4]


def test_a_repository_of_another_runtime_is_refused(tmp_path: Path) -> None:
    from ftx_triton.repository.model_config import write_config
    from ftx_triton.runtime.python.standin import use_standin
    from tritonclient.grpc import model_config_pb2 as mc

    write_config(mc.ModelConfig(name="fastertransformer", backend="fastertransformer"), tmp_path / "fastertransformer")
    with pytest.raises(ValueError, match="not served by the python runtime"):
        use_standin(tmp_path, 400)
