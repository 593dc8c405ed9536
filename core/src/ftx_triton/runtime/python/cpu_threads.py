"""How many threads torch gives each operation of a small model on the CPU: one.

torch's default is a thread per core for every matrix product. A small model's products (a decoding step of a model
under :data:`SMALL_MODEL_BYTES` of weights) are too short for a team of threads to pay off, and where the cores are
busy with other processes (the server's other stubs and fronts starting beside it, other work) every parallel
region waits for a descheduled team member: on two busy cores a 2 MB model's first greedy request took 0.4-1.6 s
with two threads and 0.03-0.09 s with one. Larger models, a GPU, or a thread count the user set
(``OMP_NUM_THREADS``) are left as they are.
"""

from __future__ import annotations

import os
from typing import Any

SMALL_MODEL_BYTES = 8 * 2**20
"""Below this many bytes of weights, one thread (products of 8 MB of fp32 weights at batch 1 ran 0.3 ms with two
threads and 0.5 with one on a loaded 2-core machine; 0.5 MB: 0.09 and 0.06 ms)."""


def weight_bytes(model: Any) -> int:
    """The bytes of a torch module's parameters and buffers (each tensor once)."""
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def fit_cpu_threads(model: Any, device: Any) -> int | None:
    """One intra-op thread for a small model on the CPU (the number set), else None (torch's choice stands)."""
    import torch

    if torch.device(device).type != "cpu" or os.environ.get("OMP_NUM_THREADS"):
        return None
    if not hasattr(model, "parameters") or weight_bytes(model) >= SMALL_MODEL_BYTES:
        return None
    torch.set_num_threads(1)
    return 1


__all__ = ["SMALL_MODEL_BYTES", "fit_cpu_threads", "weight_bytes"]
