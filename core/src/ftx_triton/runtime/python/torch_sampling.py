"""The logits processors of greedy and sampled decoding, in plain torch (importing transformers' own imports
the whole ``transformers`` package, seconds at start).

Each computes exactly what transformers' processor of the same name computes (4.57; the same operations in
the same order, so the same float32 bits), and :func:`logits_chain` lists them in the order ``generate``
applies them for a request's :class:`~.generation.Sampling`: the repetition penalty, then ftx's own processors
(presence penalty, bad words), then, when sampling, temperature, top-k and top-p. Settings that leave a
processor out in ``generate`` (a penalty of 1, a temperature of 1, top-k 0, top-p 0 or 1) leave it out here.
The runtime asks for no minimum length (``min_new_tokens`` is 0), so none is applied.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ftx_triton.runtime.python.generation import Sampling

Processor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``(ids so far [B, n], scores [B, V]) -> scores``, as a transformers ``LogitsProcessor`` is called."""


@dataclass(frozen=True)
class RepetitionPenalty:
    """transformers' ``RepetitionPenaltyLogitsProcessor``: a present token's logit divided by the penalty when
    positive, multiplied when negative."""

    penalty: float

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        score = torch.gather(scores, 1, input_ids)
        score = torch.where(score < 0, score * self.penalty, score / self.penalty)
        return scores.scatter(1, input_ids, score)


@dataclass(frozen=True)
class Temperature:
    """transformers' ``TemperatureLogitsWarper``."""

    temperature: float

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores / self.temperature


@dataclass(frozen=True)
class TopK:
    """transformers' ``TopKLogitsWarper``: logits below the k-th largest become -inf."""

    top_k: int

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        k = min(self.top_k, scores.size(-1))
        return scores.masked_fill(scores < torch.topk(scores, k)[0][..., -1, None], -float("inf"))


@dataclass(frozen=True)
class TopP:
    """transformers' ``TopPLogitsWarper``: the smallest set of most likely tokens whose probability reaches
    ``top_p`` is kept (at least one), the rest become -inf."""

    top_p: float

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        sorted_logits, sorted_indices = torch.sort(scores, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - self.top_p)
        remove[..., -1:] = 0
        return scores.masked_fill(remove.scatter(1, sorted_indices, remove), -float("inf"))


@dataclass(frozen=True)
class Chain:
    """Processors applied in turn."""

    processors: tuple[Processor, ...]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        for processor in self.processors:
            scores = processor(input_ids, scores)
        return scores


def logits_chain(sampling: Sampling, extra: Sequence[Any] = ()) -> Chain:
    """The processors ``generate`` applies for ``sampling`` with ftx's ``extra`` ones, in its order."""
    chain: list[Processor] = []
    if sampling.repetition_penalty != 1.0:
        chain.append(RepetitionPenalty(sampling.repetition_penalty))
    chain += extra
    if sampling.do_sample:
        kwargs = sampling.generate_kwargs(0)
        if kwargs["temperature"] != 1.0:
            chain.append(Temperature(kwargs["temperature"]))
        if kwargs["top_k"] != 0:
            chain.append(TopK(max(kwargs["top_k"], 1)))
        if kwargs["top_p"] < 1.0:
            chain.append(TopP(kwargs["top_p"]))
    return Chain(tuple(chain))
