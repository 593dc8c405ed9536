"""What one prompt's generation keeps for the OpenAI answers, whichever route made it (the ``text`` ensemble or
the token route of a model that answers in one piece): its text, the model's ids and log probabilities, those of
each piece yielded, and why it ended."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any


class GenerationRecord:
    """The state that ``logprobs``, ``best_of``, ``echo``, stop strings and usage read from a generation."""

    def __init__(self, prompt: str, values: Mapping[str, Any], stop: list[str]) -> None:
        self.stop = stop
        self.values = {"prompt": prompt, **values}
        self.finish_reason = "length"
        self.stopped = False
        self.text = ""
        self.token_ids: list[int] = []
        self.log_probs: list[float] = []
        self.piece_tokens: deque[tuple[list[int], list[float]]] = deque()
        self.prompt_tokens: int | None = None
        """The prompt's ids as the route that sent it tokenized them (None: not known; usage counts them then)."""

    def mean_log_prob(self) -> float:
        return sum(self.log_probs) / len(self.log_probs) if self.log_probs else 0.0
