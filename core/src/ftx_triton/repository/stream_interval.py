"""The stream interval of a decoupled ``fastertransformer`` model: which generated steps send a response.

FasterTransformer's backend sends every request of the batch one response per generated step, each holding the
whole output so far (a device-to-host copy, a Triton response and, on the ``text`` ensemble, one Python
``postprocessing`` call). ftx's backend patch set and the python runtime read two parameters of the model's
config.pbtxt:

- ``ftx_stream_interval``: ``N`` sends the first and every Nth step's responses (absent or 1: every step, as upstream);
  ``auto`` sends every ``ceil(requests / R)``th step, where requests are those the model generates in one
  execution (its batch). The whole batch then sends about R responses per step however many clients there
  are, and a request generated alone (one client) gets every step.
- ``ftx_stream_auto_responses``: R (:data:`STREAM_AUTO_RESPONSES` unless edited; read at each execution, so a
  changed value needs a model reload, not a rebuild).

The first step's response (the first token, as soon as it exists) and the final one, with the whole output,
always go.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

STREAM_INTERVAL_PARAMETER = "ftx_stream_interval"
STREAM_AUTO_RESPONSES_PARAMETER = "ftx_stream_auto_responses"
STREAM_AUTO = "auto"
STREAM_AUTO_RESPONSES = 4
"""R of ``--stream-interval auto``: about this many streamed responses per generated step for the whole batch
(1 to 4 requests get every step, 5 to 8 every 2nd, 32 every 8th)."""


def _positive(text: str) -> int | None:
    """``text`` as a whole number of at least 1, else None."""
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() and int(text) >= 1 else None


@dataclass(frozen=True)
class StreamInterval:
    """Every ``every``th step, or (``every`` None) ``auto``: every ``ceil(requests / responses)``th step."""

    every: int | None = 1
    responses: int = STREAM_AUTO_RESPONSES

    def for_batch(self, requests: int) -> int:
        """The interval for an execution generating ``requests`` requests (at least 1)."""
        if self.every is not None:
            return max(1, self.every)
        r = max(1, self.responses)
        return max(1, -(-requests // r))

    @staticmethod
    def sends(step: int, interval: int) -> bool:
        """Whether generated step ``step`` (1 is the first) sends its response at ``interval``: the first step
        (a client's first token is never held back), then every ``interval``th (the final one goes anyway)."""
        return interval <= 1 or step == 1 or step % interval == 0

    def parameters(self) -> dict[str, str]:
        """The config.pbtxt parameters that say it (none for every step, upstream's behaviour)."""
        if self.every is None:
            return {STREAM_INTERVAL_PARAMETER: STREAM_AUTO, STREAM_AUTO_RESPONSES_PARAMETER: str(self.responses)}
        return {STREAM_INTERVAL_PARAMETER: str(self.every)} if self.every > 1 else {}

    @classmethod
    def from_parameters(cls, params: Mapping[str, str]) -> StreamInterval:
        """As the backend patch reads the parameters: ``auto``, a number above 1, else every step; R when it is
        a number of at least 1, else :data:`STREAM_AUTO_RESPONSES`."""
        interval = params.get(STREAM_INTERVAL_PARAMETER, "")
        responses = _positive(params.get(STREAM_AUTO_RESPONSES_PARAMETER, "")) or STREAM_AUTO_RESPONSES
        if interval == STREAM_AUTO:
            return cls(None, responses)
        return cls(_positive(interval) or 1, responses)

    def describe(self) -> str:
        """In words, for a dry run and ``ftx configure``."""
        if self.every is None:
            return (
                f"interval auto: a response every ceil(requests in the batch / {self.responses}) tokens, "
                f"about {self.responses} per step for the whole batch"
            )
        return "a response every token" if self.every <= 1 else f"a response every {self.every} tokens and the last"


__all__ = [
    "STREAM_AUTO",
    "STREAM_AUTO_RESPONSES",
    "STREAM_AUTO_RESPONSES_PARAMETER",
    "STREAM_INTERVAL_PARAMETER",
    "StreamInterval",
]
