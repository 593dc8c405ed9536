"""Every field of an OpenAI completions or chat request: honoured through FasterTransformer's inputs, or refused.

No field is ignored. Each known field is either honoured (mapped onto what FasterTransformer computes,
through the ``text`` model's inputs) or refused with a 400 that says why; a field this endpoint does not
know is refused too (``unsupported_parameter``), unless it is ``null``.

What maps where:

* ``max_tokens`` / ``max_completion_tokens`` → ``request_output_len``; ``temperature``, ``top_p``, ``top_k``
  (an extension, as vLLM has it) and ``repetition_penalty`` (likewise) → FT's inputs of the same meaning;
* ``seed`` → FT's ``random_seed`` (same seed, same text);
* ``stop`` → cut in the text, and sent as FT stop words so generation ends there;
* ``logit_bias`` of -100 → FT's ``bad_words_list`` (those tokens are never generated); FT has no other bias;
* ``logprobs`` (completions: 0; chat: ``true`` with ``top_logprobs`` 0) → each chosen token's log probability
  from FT's ``output_log_probs``; FT computes no alternatives, so asking for any is refused;
* ``n`` and ``best_of`` → that many generations of the prompt (replicated rows, each its own seed when
  ``seed`` is given: ``seed + i``); with ``best_of`` the ``n`` of highest mean token log probability are
  answered;
* ``presence_penalty`` / ``frequency_penalty`` of 0 are accepted; any other value is refused (FasterTransformer
  has no frequency penalty, and its presence penalty excludes the repetition penalty the text model sends);
* ``echo``, ``stream``, ``stream_options.include_usage``, ``response_format`` ``text``, ``user`` (an
  identifier: nothing generated depends on it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ftx_triton.client.text_client import sampling_values
from ftx_triton.repository.textproc import MAX_WORD_CHARS, MAX_WORDS

MAX_TOKENS_DEFAULT = 16
"""OpenAI's default for /v1/completions."""
MAX_CHOICES = 16
"""The largest ``n`` / ``best_of``: generations one request may ask for per prompt."""
MAX_STOP = 4
"""Stop strings one request may carry (OpenAI's own limit)."""
MAX_SEED = (1 << 63) - 1
MAX_LOGPROBS = 5
"""OpenAI's largest ``logprobs`` (completions); chat's ``top_logprobs`` goes to 20."""


class BadRequest(Exception):
    """A request OpenAI's API would refuse (HTTP 400, or ``status``; ``code`` as OpenAI names it)."""

    def __init__(self, message: str, param: str | None = None, *, status: int = 400, code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.status, self.code = param, status, code


COMMON = {
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "n",
    "stream",
    "stream_options",
    "stop",
    "seed",
    "logit_bias",
    "logprobs",
    "presence_penalty",
    "frequency_penalty",
    "user",
    "max_completion_tokens",
}
FIELDS = {
    "completions": COMMON | {"prompt", "best_of", "echo", "suffix"},
    "chat": COMMON | {"messages", "top_logprobs", "response_format"},
}
REFUSED = {
    "tools": "this endpoint does no tool calling",
    "functions": "this endpoint does no function calling",
    "tool_choice": "this endpoint does no tool calling",
    "parallel_tool_calls": "this endpoint does no tool calling",
}
"""Known features the endpoint lacks, with the reason given."""


def _show(value: float) -> str:
    """A limit as people write it: ``1048576``, ``0.5``."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def number(body: Mapping[str, Any], name: str, kind: type, low: float, high: float) -> Any:
    """``body[name]`` as an integer or number within [low, high], or None when absent."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and not isinstance(value, int)):
        raise BadRequest(f"{name} must be {'an integer' if kind is int else 'a number'}", name)
    if not low <= value <= high:
        raise BadRequest(f"{name} must be between {_show(low)} and {_show(high)}", name)
    return value


def _flag(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be true or false", name)
    return value


def _unsupported(name: str, why: str) -> BadRequest:
    return BadRequest(
        f"{name} is not supported: {why}; send the request without it", name, code="unsupported_parameter"
    )


@dataclass
class Params:
    """A request's generation settings: the text model's role values and what the endpoint does around them."""

    values: dict[str, Any]
    stop: list[str]
    stream: bool = False
    n: int = 1
    best_of: int = 1
    logprobs: bool = False
    include_usage: bool = False
    echo: bool = False
    seed: int | None = None
    banned: list[int] = field(default_factory=list)

    def for_choice(self, index: int) -> dict[str, Any]:
        """The role values of generation ``index`` (its own seed when the request gave one)."""
        values = dict(self.values)
        if self.seed is not None:
            values["seed"] = (self.seed + index) % (MAX_SEED + 1)
        return values


def parse_params(body: Mapping[str, Any], kind: str, vocab_size: int | None) -> Params:
    """Check every field of a ``completions`` or ``chat`` body and map it (see the module's docstring)."""
    for name in body:
        if body[name] is None or name in FIELDS[kind]:
            continue
        if name == "tool_choice" and body[name] == "none":
            continue
        if name in REFUSED and body[name] in (False, [], {}):
            continue
        raise _unsupported(name, REFUSED.get(name, "this endpoint does not know this field"))
    max_tokens = number(body, "max_tokens", int, 1, 1 << 20)
    if max_tokens is None:
        max_tokens = number(body, "max_completion_tokens", int, 1, 1 << 20)
    temperature = number(body, "temperature", float, 0, 2)
    top_p = number(body, "top_p", float, 0, 1)
    top_k = number(body, "top_k", int, 0, 1 << 20)
    values = sampling_values(max_tokens or MAX_TOKENS_DEFAULT, temperature or None, top_k or None, top_p)
    repetition = number(body, "repetition_penalty", float, 1e-4, 100)
    if repetition is not None and repetition != 1:
        values["repetition_penalty"] = float(repetition)
    for name in ("presence_penalty", "frequency_penalty"):
        if number(body, name, float, -2, 2):
            raise _unsupported(
                name,
                "FasterTransformer has no frequency penalty"
                if name == "frequency_penalty"
                else "FasterTransformer's presence penalty cannot be combined with the repetition penalty this "
                "endpoint's model always applies; use repetition_penalty (1 = off) instead",
            )
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > MAX_STOP:
        raise BadRequest(f"stop must be a string or a list of up to {MAX_STOP} non-empty strings", "stop")
    if any(len(s) > MAX_WORD_CHARS for s in stop):
        raise BadRequest(f"stop strings may have at most {MAX_WORD_CHARS} characters", "stop")
    if stop:
        values["stop"] = list(stop)
    seed = number(body, "seed", int, 0, MAX_SEED)
    banned = _logit_bias(body.get("logit_bias"), vocab_size)
    if banned:
        values["bad_token_ids"] = banned
    params = Params(values, stop, _flag(body, "stream"), seed=seed, banned=banned)
    params.n = number(body, "n", int, 1, MAX_CHOICES) or 1
    params.best_of = number(body, "best_of", int, 1, MAX_CHOICES) or params.n
    if params.best_of < params.n:
        raise BadRequest(f"best_of ({params.best_of}) must be at least n ({params.n})", "best_of")
    if params.best_of > params.n and params.stream:
        raise BadRequest("best_of cannot be used with stream (the best are known only at the end)", "best_of")
    params.logprobs = _logprobs(body, kind)
    if params.logprobs or params.best_of > params.n:
        values["logprobs"] = True  # FasterTransformer's greedy log probabilities need it (see textproc)
    params.echo = _flag(body, "echo")
    if params.echo and params.logprobs:
        raise _unsupported(
            "echo", "with logprobs it asks for the prompt's log probabilities, which FasterTransformer does not compute"
        )
    suffix = body.get("suffix")
    if suffix not in (None, ""):
        raise _unsupported("suffix", "FasterTransformer generates after the prompt only, it does not insert text")
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise _unsupported("response_format", 'only {"type": "text"} is produced (no JSON mode or schemas)')
    params.include_usage = _stream_options(body.get("stream_options"), params.stream)
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise BadRequest("user must be a string", "user")
    return params


def _logprobs(body: Mapping[str, Any], kind: str) -> bool:
    """Whether the chosen tokens' log probabilities are asked for; alternatives are refused (FT has none)."""
    computes = "FasterTransformer computes only the chosen token's log probability, no alternatives"
    if kind == "completions":
        asked = number(body, "logprobs", int, 0, MAX_LOGPROBS)
        if asked:
            raise BadRequest(
                f"logprobs {asked} asks for {asked} alternative tokens per position: {computes}; send logprobs 0",
                "logprobs",
                code="unsupported_parameter",
            )
        return asked == 0
    wanted = _flag(body, "logprobs")
    top = number(body, "top_logprobs", int, 0, 20)
    if top:
        raise BadRequest(
            f"top_logprobs {top}: {computes}; send top_logprobs 0 (or leave it out)",
            "top_logprobs",
            code="unsupported_parameter",
        )
    if top is not None and not wanted:
        raise BadRequest("top_logprobs needs logprobs: true", "top_logprobs")
    return wanted


def _logit_bias(bias: Any, vocab_size: int | None) -> list[int]:
    """Token ids of a ``logit_bias`` whose values are all -100 (never generate them)."""
    if bias is None:
        return []
    if not isinstance(bias, dict):
        raise BadRequest("logit_bias must map token ids to numbers", "logit_bias")
    if len(bias) > MAX_WORDS:
        raise BadRequest(f"logit_bias holds {len(bias)} tokens; at most {MAX_WORDS} are accepted", "logit_bias")
    banned = []
    for key, value in bias.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            raise BadRequest(f"logit_bias key {key[:40]!r} is not a token id", "logit_bias")
        token = int(key)
        if vocab_size is not None and token >= vocab_size:
            raise BadRequest(f"logit_bias token {token} is outside the vocabulary (0..{vocab_size - 1})", "logit_bias")
        if isinstance(value, bool) or not isinstance(value, int | float) or not -100 <= value <= 100:
            raise BadRequest("logit_bias values must be numbers between -100 and 100", "logit_bias")
        if value == 0:
            continue
        if value != -100:
            raise BadRequest(
                f"logit_bias {value:g} for token {token} is not supported: FasterTransformer can only ban "
                "tokens (its bad_words_list), so -100 (never generate the token) is the one value honoured",
                "logit_bias",
                code="unsupported_parameter",
            )
        banned.append(token)
    return banned


def _stream_options(options: Any, stream: bool) -> bool:
    """``stream_options``: only with stream; ``include_usage`` sends a last chunk with the token counts."""
    if options is None:
        return False
    if not stream:
        raise BadRequest("stream_options is only allowed with stream: true", "stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise _unsupported("stream_options", "only include_usage is known")
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise BadRequest("stream_options.include_usage must be true or false", "stream_options")
    return include
