"""One torch thread for a small model on the CPU, in the stub (``runtime/python/cpu_threads.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from ftx_triton.runtime.python.cpu_threads import SMALL_MODEL_BYTES, fit_cpu_threads, weight_bytes


@pytest.fixture
def two_threads() -> Iterator[None]:
    """torch's thread count is the process's: set to 2 for the test, restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_a_small_model_on_the_cpu_gets_one_thread(two_threads: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    small = torch.nn.Linear(64, 64)
    assert weight_bytes(small) == (64 * 64 + 64) * 4
    assert fit_cpu_threads(small, torch.device("cpu")) == 1
    assert torch.get_num_threads() == 1


def test_a_large_model_a_gpu_or_the_users_thread_count_is_left_alone(
    two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    side = int((SMALL_MODEL_BYTES / 4) ** 0.5) + 1
    large = torch.nn.Linear(side, side, bias=False, device="meta")  # its bytes are counted, none allocated
    assert weight_bytes(large) >= SMALL_MODEL_BYTES
    assert fit_cpu_threads(large, "cpu") is None
    assert fit_cpu_threads(torch.nn.Linear(4, 4), "cuda") is None
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert fit_cpu_threads(torch.nn.Linear(4, 4), "cpu") is None
    assert torch.get_num_threads() == 2


def test_a_tied_weight_counts_once() -> None:
    embed = torch.nn.Embedding(10, 8)
    head = torch.nn.Linear(8, 10, bias=False)
    head.weight = embed.weight
    assert weight_bytes(torch.nn.ModuleList([embed, head])) == 10 * 8 * 4
