"""A STAND-IN ``fastertransformer`` model for serving benchmarks on a machine without a GPU: the python runtime's
model (:class:`~.triton_model.FtModel`: the same request checks, the same output tensors, streaming and the stream
interval) whose generation costs a fixed wall time per batch, whatever the batch's size, and no CPU.

A GPU's decoding is near batch-insensitive up to tens of requests (one generation of 128 tokens takes about the
same 0.4-0.6 s for 1 and for 64 requests), while the python runtime's real model on a CPU takes longer the larger
the batch and competes with the clients, the fronts and the text models for the same cores, which spreads the
clients' arrivals at the model. This model sleeps instead (``time.sleep``: the stub's thread waits, the cores stay
free), so the Triton dynamic batcher in front of it sees what it sees on a GPU host. Its "generation" echoes the
prompt (as the repository tests' fake FasterTransformer model does), cycled up to the request's output length,
from the prompt's middle on, never the end id, so every request generates exactly ``request_output_len`` tokens.

:func:`use_standin` turns a repository that ``ftx configure --runtime python`` wrote into one served by the stand-in
(only ``fastertransformer/1/model.py`` and one parameter of its config.pbtxt change). Not for users: nothing in ftx
selects it; ``benchmarks/bench_burst_spread.py --standin-ms N`` does.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ftx_triton.runtime.python import triton_model
from ftx_triton.runtime.python.generation import DECODER, Generator, Item, ItemResult, ModelLimits, StepSink, TokenEvent

STANDIN_PARAMETER = "ftx_standin_execution_ms"
"""config.pbtxt parameter: the wall time of one execution (a whole generation), milliseconds."""


@dataclass
class StandInGenerator(Generator):
    """Parses requests as the python runtime does; "generates" by sleeping ``execution_s`` per batch."""

    execution_s: float = 0.5

    def run(self, items: Sequence[Item], sink: StepSink | None = None) -> list[ItemResult]:
        assert self.limits is not None
        steps = max((item.output_len for item in items), default=0)
        tokens = [self._tokens(item) for item in items]
        if sink is None or steps == 0:
            time.sleep(self.execution_s)
        else:  # streamed: one event per step, the batch's wall time spread over its steps
            started, per_step = time.monotonic(), self.execution_s / steps
            for step in range(steps):
                events = [
                    TokenEvent(i, int(row[step]), step + 1 == item.output_len, None)
                    for i, (item, row) in enumerate(zip(items, tokens, strict=True))
                    if step < item.output_len
                ]
                time.sleep(max(0.0, started + (step + 1) * per_step - time.monotonic()))
                sink.on_tokens(events)
        return [
            ItemResult(row[None, :], np.array([item.output_len], np.int64))
            for item, row in zip(items, tokens, strict=True)
        ]

    def _tokens(self, item: Item) -> np.ndarray:
        """The prompt from its middle on, cycled to ``output_len`` tokens (an answer that does not start with its
        prompt, whose text tokenizes back to about as many tokens), the end id replaced (every item runs its whole
        length)."""
        assert self.limits is not None
        source = np.asarray(item.prompt, np.int64).reshape(-1)
        if source.size == 0:
            source = np.array([self.limits.start_id], np.int64)
        row = np.resize(np.roll(source, -(source.size // 2)), item.output_len)
        row[row == item.sampling.end_id] = (item.sampling.end_id + 1) % self.limits.vocab_size
        return row


def standin_model(config: Mapping[str, Any]) -> triton_model.FtModel:
    """The stand-in for the model ``config`` (config.pbtxt as Triton's JSON) describes: its limits from the
    checkpoint's config.ini (no weights read), its wall time from :data:`STANDIN_PARAMETER`."""
    from ftx_triton.plugins import load_host
    from ftx_triton.runtime.python.hf_model import read_ft_ini

    params = triton_model.parameters_of(config)
    family = load_host(families_only=True).family(params[triton_model.FAMILY_PARAMETER])
    ini = read_ft_ini(Path(params["model_checkpoint_path"]))
    spec, hf = family.spec_from_ini(ini), family.hf_config_from_ini(ini)
    positions = params.get(triton_model.POSITIONS_PARAMETER, "")
    limits = ModelLimits(
        vocab_size=int(hf["vocab_size"]),
        end_id=spec.end_id,
        start_id=spec.start_id,
        max_positions=int(positions) if positions.isdigit() else None,
    )
    generator = StandInGenerator(None, DECODER, None, limits, execution_s=float(params[STANDIN_PARAMETER]) / 1e3)
    return triton_model.FtModel.serving(generator, config)


class TritonPythonModel(triton_model.TritonPythonModel):
    """The python runtime's Triton entry point over :func:`standin_model`."""

    def load(self, config: Mapping[str, Any]) -> triton_model.FtModel:
        return standin_model(config)


def use_standin(repository: Path, execution_ms: float) -> None:
    """Serve ``repository`` (a python-runtime repository, changed in place) with the stand-in taking
    ``execution_ms`` per execution."""
    from ftx_triton.plugins import load_host
    from ftx_triton.repository.model_config import parse_config, set_parameters, write_config
    from ftx_triton.runtime.python.repository import write_model_py

    model_dir = repository / "fastertransformer"
    config = parse_config(model_dir / "config.pbtxt")
    if config.backend != "python":
        raise ValueError(f"{model_dir} is not served by the python runtime (backend {config.backend!r})")
    set_parameters(config, {STANDIN_PARAMETER: f"{execution_ms:g}"})
    write_config(config, model_dir)
    family = load_host(families_only=True).family(config.parameters[triton_model.FAMILY_PARAMETER].string_value)
    write_model_py(model_dir, __name__, family)


__all__ = ["STANDIN_PARAMETER", "StandInGenerator", "TritonPythonModel", "standin_model", "use_standin"]
