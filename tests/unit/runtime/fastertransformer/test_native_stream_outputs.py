"""The stream outputs of ftx's patched backend (``patch_files/ftx_stream_outputs.h``), without a GPU.

A decoupled FasterTransformer model resends the whole sequence, prompt included, in every streamed response; the
patched backend adds where each response's new tokens start (``ftx_stream_offset``) and the prompt lengths, so the
text ensemble's postprocessing decodes each piece once. The header is compiled with the host compiler against a FAKE
CUDA runtime and Triton enum stand-ins (``stream_outputs_harness/``: "device" memory is host memory, device copies
are counted and can be made to fail); the driver calls it as the backend's streaming callback and final response
do. The real backend is compiled on the GPU machine (``ftx backend build``); these tests skip without g++.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from fake_cuda_build import compile_driver, copy_patch_files

HARNESS = Path(__file__).parent / "stream_outputs_harness"


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stream-outputs")
    copy_patch_files(root, "ftx_stream_outputs.h")
    args = [f"-I{HARNESS}", f"-I{root}", str(HARNESS / "driver.cc")]
    return compile_driver(root / "driver", *args, what="the stream outputs")


def responses(driver: Path, *args: object, **env: str) -> list[dict[str, list[int] | None]]:
    """One dict per response: its offsets and prompt lengths per row and beam (None: not in the outputs) and the
    fake device copies made so far."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
    done = subprocess.run(
        [str(driver), *map(str, args)], capture_output=True, text=True, timeout=60, env=clean | env, check=True
    )
    parsed = []
    for line in done.stdout.splitlines():
        words = line.split()
        offsets, prompts, copies = words.index("offsets"), words.index("prompts"), words.index("copies")
        prompt_values = words[prompts + 1 : copies]
        parsed.append(
            {
                "offsets": [int(w) for w in words[offsets + 1 : prompts]],
                "prompts": None if prompt_values == ["none"] else [int(w) for w in prompt_values],
                "copies": [int(words[copies + 1])],
            }
        )
    return parsed


def test_offsets_start_after_each_prompt_then_after_what_the_last_response_carried(driver: Path) -> None:
    # two rows (prompts of 3 and 5 tokens), three streamed responses and the final one
    got = responses(driver, 2, 1, "3,5", "4,6", "6,8", "7,8", "9,8")
    assert [r["offsets"] for r in got] == [[3, 5], [4, 6], [6, 8], [7, 8]]
    assert all(r["prompts"] == [3, 5] for r in got)  # the model gave none: the prompt lengths are added
    assert [r["copies"] for r in got] == [[0], [1], [2], [3]]  # sequence_length read from the GPU once per response


def test_every_beam_of_a_row_gets_the_row_offset_from_its_longest_beam(driver: Path) -> None:
    got = responses(driver, 1, 2, "4", "5,5", "6,7", "8,7")
    assert [r["offsets"] for r in got] == [[4, 4], [5, 5], [7, 7]]
    assert got[0]["prompts"] == [4, 4]


def test_a_model_without_prompt_lengths_starts_at_zero_and_gets_none_added(driver: Path) -> None:
    """T5: the output holds decoder tokens only and the model takes no ``input_lengths``."""
    got = responses(driver, 1, 1, "none", "1", "2", "3")
    assert [r["offsets"] for r in got] == [[0], [1], [2]]
    assert all(r["prompts"] is None for r in got)


def test_the_models_own_prompt_lengths_are_kept(driver: Path) -> None:
    got = responses(driver, 1, 1, "4", "5", "6", FAKE_MODEL_PROMPTS="9")
    assert [r["prompts"] for r in got] == [[9], [9]]
    assert [r["offsets"] for r in got] == [[4], [5]]


def test_a_failed_device_copy_keeps_the_offsets_so_no_text_is_lost(driver: Path) -> None:
    """A response whose lengths could not be read leaves the next offset where it was: text may repeat, none is
    skipped."""
    got = responses(driver, 1, 1, "4", "5", "6", FAKE_COPY_FAILS="1")
    assert [r["offsets"] for r in got] == [[4], [4]]


def test_lengths_in_host_memory_are_read_without_a_device_copy(driver: Path) -> None:
    got = responses(driver, 1, 1, "4", "5", "7", FAKE_LENGTHS_ON_HOST="1")
    assert [r["offsets"] for r in got] == [[4], [5]]
    assert [r["copies"] for r in got] == [[0], [0]]
