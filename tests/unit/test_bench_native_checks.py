"""The native benchmark's guards against figures that cannot be true (no GPU needed: answers are built
here as FasterTransformer returns them)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))

from bench_native_ft import MeasurementFault, generated_tokens, markdown, step_bytes_per_gpu, within_bound  # noqa: E402

VOCAB, END = 1000, 1007
PROMPTS = np.array([[101, 102, 103], [201, 202, 203]], np.uint32)


def _answer(rows: list[list[int]]) -> np.ndarray:
    return np.array(rows, np.int64).reshape(len(rows), 1, -1)


def test_a_full_answer_counts_every_generated_token() -> None:
    ids = _answer([[101, 102, 103, 5, 6, 7, 8], [201, 202, 203, 9, 10, 11, 12]])
    assert generated_tokens(PROMPTS, ids, np.array([[7], [7]]), 4, END, VOCAB) == 8


def test_a_row_that_stopped_early_is_refused_although_sequence_length_claims_the_full_length() -> None:
    """The old count (sequence_length - prompt) took this answer as 8 tokens; 2 were never generated."""
    ids = _answer([[101, 102, 103, 5, 6, END, END], [201, 202, 203, 9, 10, 11, 12]])
    lengths = np.array([[7], [7]])
    assert int((lengths - PROMPTS.shape[1]).sum()) == 8  # what the old benchmark counted
    with pytest.raises(MeasurementFault, match="row 0: only 2 of 4 tokens were generated"):
        generated_tokens(PROMPTS, ids, lengths, 4, END, VOCAB)


def test_short_lengths_a_lost_prompt_and_ids_outside_the_vocabulary_are_refused() -> None:
    good = [[101, 102, 103, 5, 6, 7, 8], [201, 202, 203, 9, 10, 11, 12]]
    with pytest.raises(MeasurementFault, match="row 1: sequence_length 6, expected 3 \\+ 4"):
        generated_tokens(PROMPTS, _answer(good), np.array([[7], [6]]), 4, END, VOCAB)
    with pytest.raises(MeasurementFault, match="row 1: the answer does not start with its prompt"):
        generated_tokens(PROMPTS, _answer([good[0], [0, 202, 203, 9, 10, 11, 12]]), np.array([[7], [7]]), 4, END, VOCAB)
    with pytest.raises(MeasurementFault, match="outside the vocabulary"):
        generated_tokens(
            PROMPTS, _answer([good[0], [201, 202, 203, 9, 10, 1000, 12]]), np.array([[7], [7]]), 4, END, VOCAB
        )


def test_a_rate_above_the_hbm_bound_is_refused_and_printed_as_refused() -> None:
    assert within_bound(200.0, 215.0, "batch 1") == 200.0
    with pytest.raises(MeasurementFault, match="254.2 tok/s is 1.18x the HBM bound of 215.0"):
        within_bound(254.2, 215.0, "batch 1")
    report = {
        "bandwidth_gbs": 2950,
        "read_bandwidth_gbs": 3100,
        "batches": [1],
        "shapes": {
            "gptneox": {
                "native": {
                    "fp16 tp1": {
                        "tp": 1,
                        "weight_bytes": 13_700_000_000,
                        "step_bytes_per_gpu": 13_300_000_000,
                        "untuned": {"1": {"refused": "over"}},
                    }
                }
            }
        },
    }
    table = markdown(report)
    assert "refused (over the bound)" in table and "254" not in table


def test_a_step_reads_every_weight_but_the_input_embedding(tmp_path: Path) -> None:
    (tmp_path / "model.wte.bin").write_bytes(b"\0" * 400)
    (tmp_path / "model.lm_head.weight.bin").write_bytes(b"\0" * 400)
    (tmp_path / "model.layers.0.attention.dense.weight.0.bin").write_bytes(b"\0" * 1200)
    assert step_bytes_per_gpu(tmp_path, 1) == (2000, 1600)
    assert step_bytes_per_gpu(tmp_path, 2) == (1000, 800)


def test_ids_equal_compares_custom_all_reduce_on_with_off() -> None:
    from bench_native_ft import ids_equal

    def run(ids: dict[int, str]) -> dict:
        return {"untuned": {"ids": ids, 1: 1.0, 8: 2.0}}

    report = {
        "batches": [1, 8],
        "shapes": {
            "gptj": {
                "native": {
                    "fp16 tp2 all-reduce off": run({1: "a", 8: "b"}),
                    "fp16 tp2 all-reduce on": run({1: "a", 8: "c"}),
                    "fp16 tp1": run({1: "a", 8: "b"}),
                }
            }
        },
    }
    assert ids_equal(report) == [
        "gptj fp16 tp2 all-reduce on batch 1: token ids EQUAL to all-reduce off",
        "gptj fp16 tp2 all-reduce on batch 8: token ids DIFFER from all-reduce off",
    ]
