"""FasterTransformer request tensors → decoding (a plain-torch decoder, or ``transformers``' ``generate``) →
FasterTransformer outputs.

The python runtime answers the ``fastertransformer`` model's own interface:

* decoder models (GPT-J, GPT-NeoX, KoGPT): ``input_ids`` [B, S] right-padded, ``input_lengths``
  [B], ``request_output_len`` [B, 1] → ``output_ids`` [B, beam, S + max(request_output_len)]
  *including the prompt*, ``sequence_length`` [B, beam] (prompt + generated tokens);
* encoder-decoder models (T5): ``input_ids`` [B, S], ``sequence_length`` [B] (encoder lengths),
  ``max_output_len`` [B] (first element) → ``output_ids`` [B, beam, max_output_len] decoder tokens
  only, ``sequence_length`` [B, beam] generated lengths.

Optional inputs follow FasterTransformer's meaning: ``runtime_top_k``/``runtime_top_p`` (0 = off,
both off = greedy), ``temperature``, ``repetition_penalty``, ``len_penalty``, ``beam_width`` (first
element for the batch), ``random_seed``, ``start_id``/``end_id``, ``bad_words_list``/``stop_words_list``
(``[2, W]`` per item: concatenated ids, then cumulative end offsets padded with -1) and
``is_return_log_probs``. A generated sequence ends with ``end_id`` (counted in its length), after a
stop word (counted), or after its own ``request_output_len``; what follows is ``end_id`` padding.
``beam_search_diversity_rate``, ``top_p_decay``/``top_p_min``/``top_p_reset_ids``,
``prompt_learning_task_name_ids`` and T5's ``ia3_tasks`` have no ``transformers`` counterpart: they
are accepted, and a value that would change FasterTransformer's output is logged once
(``runtime.input_ignored``); prompt embeddings (``request_prompt_embedding``) are refused.
Every number is checked (finite, in range) when a request is parsed, so one bad request is refused
alone instead of failing the batch it would have joined.

Each batch item is one :class:`Item`; items of any number of requests with the same sampling
settings run as left-padded ``generate`` calls of at most ``max_batch_tokens`` tokens
(:meth:`Generator.run`). While streaming, each step reaches a :class:`StepSink`: the new token of
every running item (with its log probability when asked) or, for beam search, the current beams.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import structlog

from ftx_triton.runtime.python.decode_loop import (
    EAGER,
    LOOP_MODES,
    TRANSFORMERS_STATIC,
    LeanDecoder,
    decode_mode,
    supports_loop,
)
from ftx_triton.runtime.python.words import MAX_WORD_TOKENS, MAX_WORDS, trie

log = structlog.get_logger(__name__)

MAX_NEW_TOKENS = 4096
"""Upper bound on tokens generated per request when the model has no position limit."""
MAX_BATCH_TOKENS = 32768
"""Default of ``FTX_MAX_BATCH_TOKENS``: rows x (prompt + new tokens) one ``generate`` call may hold,
so a large dynamic batch runs as several calls instead of exhausting memory."""
BATCH_TOKENS_ENV = "FTX_MAX_BATCH_TOKENS"

DECODER = "decoder"
ENCODER_DECODER = "encoder-decoder"

Words = tuple[tuple[int, ...], ...]


class RequestError(ValueError):
    """A request the model refuses; it becomes a Triton error response for that request only."""


GREEDY_BELOW_TEMPERATURE = 1e-5
"""Temperatures below this decode greedily: the limit of sampling as the temperature falls."""
REPETITION_PENALTY_RANGE = (1e-4, 1e4)
"""Beyond these, dividing or multiplying a logit by the penalty overflows float32."""
PRESENCE_PENALTY_LIMIT = 1e4
"""|presence_penalty| beyond this is no longer a penalty but an overflow of the logits."""
LEN_PENALTY_LIMIT = 10.0
"""|len_penalty| above this overflows a beam's length ** len_penalty."""


@dataclass(frozen=True)
class Sampling:
    """How one item is decoded (FasterTransformer semantics); items with equal Sampling batch together."""

    end_id: int
    start_id: int
    top_k: int = 0
    top_p: float = 0.0
    temperature: float = 1.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0  # FT's, times the temperature (FT subtracts it after dividing by the temperature)
    len_penalty: float = 0.0
    beam_width: int = 1
    random_seed: int = 0
    bad_words: Words = ()
    log_probs: bool = False

    @property
    def do_sample(self) -> bool:
        """FT: top-k 0 and top-p 0 (or top-k 1) is greedy; a temperature below GREEDY_BELOW_TEMPERATURE
        (0 included) also means greedy here, its limit (dividing the logits by less overflows them)."""
        if self.beam_width > 1 or self.temperature < GREEDY_BELOW_TEMPERATURE:
            return False
        return self.top_k > 1 or (self.top_k == 0 and self.top_p > 0)

    def pad_id(self, vocab_size: int) -> int:
        """What fills prompts and finished rows inside generate: end_id when it is a real token, else 0
        (the model embeds these ids; the outputs are padded with end_id afterwards)."""
        return self.end_id if self.end_id < vocab_size else 0

    def generate_kwargs(self, vocab_size: int) -> dict[str, Any]:
        """Keyword arguments of ``transformers.GenerationConfig``."""
        kwargs: dict[str, Any] = {
            "do_sample": self.do_sample,
            "num_beams": self.beam_width,
            "num_return_sequences": self.beam_width,
            "eos_token_id": self.end_id,
            "pad_token_id": self.pad_id(vocab_size),
            "repetition_penalty": self.repetition_penalty,
        }
        if self.do_sample:
            kwargs.update(
                temperature=self.temperature, top_k=max(0, self.top_k), top_p=self.top_p if 0 < self.top_p < 1 else 1.0
            )
        if self.beam_width > 1:
            kwargs.update(length_penalty=self.len_penalty, early_stopping=False)
        return kwargs


@dataclass(frozen=True)
class Item:
    """One batch item of one request."""

    prompt: np.ndarray  # int64 [L]: decoder prompt, or encoder input for encoder-decoder models
    output_len: int
    sampling: Sampling
    stop_words: Words = ()


@dataclass
class ItemResult:
    """Generated tokens of one item (prompt excluded), one row per beam."""

    tokens: np.ndarray  # int64 [beam, n], end_id after each row's length
    lengths: np.ndarray  # int64 [beam]
    log_probs: np.ndarray | None = None  # float32 [beam, n]

    @property
    def cum_log_probs(self) -> np.ndarray:
        if self.log_probs is None:
            return np.zeros(len(self.lengths), np.float32)
        mask = np.arange(self.log_probs.shape[1])[None, :] < self.lengths[:, None]
        return (self.log_probs * mask).sum(axis=1).astype(np.float32)


@dataclass
class ParsedRequest:
    """A validated request: its items and the padded input length it came with."""

    items: list[Item]
    input_len: int  # S of input_ids [B, S]
    kind: str = DECODER


@dataclass(frozen=True)
class ModelLimits:
    """What requests are checked against."""

    vocab_size: int
    end_id: int
    start_id: int
    max_positions: int | None = None  # prompt + generated tokens, for models with learned/cached positions
    max_new_tokens: int = MAX_NEW_TOKENS
    max_beam_width: int = 16
    max_batch_tokens: int = MAX_BATCH_TOKENS


# --------------------------------------------------------------------------- parsing


def decode_words(array: np.ndarray | None, batch: int, what: str) -> list[Words]:
    """FT word lists ``[B, 2, W]`` → per item a tuple of token-id tuples (``[[0], [-1]]`` = none).

    At most :data:`~.words.MAX_WORDS` words of :data:`~.words.MAX_WORD_TOKENS` tokens per item: the
    width is checked before any offset is read, so a huge list is refused without being walked.
    """
    if array is None:
        return [()] * batch
    data = np.asarray(array)
    if data.ndim == 2:
        data = data[None]
    if data.ndim != 3 or data.shape[1] != 2 or data.shape[0] not in (1, batch):
        raise RequestError(f"{what} must have shape [batch, 2, W], got {list(np.asarray(array).shape)}")
    if data.shape[2] > MAX_WORDS * MAX_WORD_TOKENS:
        raise RequestError(
            f"{what} is {data.shape[2]} ids wide; an item may hold at most {MAX_WORDS} words of at most "
            f"{MAX_WORD_TOKENS} tokens ({MAX_WORDS * MAX_WORD_TOKENS} ids)"
        )
    out: list[Words] = []
    for row in data if data.shape[0] == batch else np.repeat(data, batch, axis=0):
        ids, offsets = row[0].astype(np.int64), row[1].astype(np.int64)
        cut = np.flatnonzero(offsets < 0)
        offsets = offsets[: cut[0]] if cut.size else offsets
        starts = np.concatenate([[0], offsets[:-1]]) if offsets.size else offsets
        if offsets.size and ((offsets < starts).any() or offsets[-1] > len(ids)):
            raise RequestError(
                f"{what}: offsets must be increasing end positions within the ids (got {offsets[:16].tolist()}…)"
            )
        spans = [(int(a), int(b)) for a, b in zip(starts, offsets, strict=True) if b > a]
        if len(spans) > MAX_WORDS:
            raise RequestError(f"{what} holds {len(spans)} words for one item; at most {MAX_WORDS} are accepted")
        if any(b - a > MAX_WORD_TOKENS for a, b in spans):
            raise RequestError(f"{what} holds a word longer than {MAX_WORD_TOKENS} tokens")
        out.append(tuple(tuple(int(t) for t in ids[a:b]) for a, b in spans))
    return out


def _per_item(inputs: Mapping[str, np.ndarray], name: str, batch: int) -> np.ndarray | None:
    """An optional ``[B]``/``[B, 1]`` input as a flat array of length ``batch`` (a single value broadcasts)."""
    value = inputs.get(name)
    if value is None:
        return None
    flat = np.asarray(value).reshape(-1)
    if flat.size == 1:
        return np.repeat(flat, batch)
    if flat.size and flat.size % batch == 0:
        return flat.reshape(batch, -1)[:, 0]
    raise RequestError(f"{name} must have one value per batch item ({batch}), got shape {list(np.shape(value))}")


def _check_ids(name: str, ids: np.ndarray, vocab_size: int) -> None:
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise RequestError(
            f"{name} holds token id {int(ids.max() if ids.max() >= vocab_size else ids.min())}, "
            f"outside the vocabulary (0..{vocab_size - 1})"
        )


def parse_request(inputs: Mapping[str, np.ndarray], limits: ModelLimits, kind: str = DECODER) -> ParsedRequest:
    """Validate FT input tensors (as numpy, batch dim first) and split them into items."""
    ids = inputs.get("input_ids")
    if ids is None:
        raise RequestError("input_ids is required")
    ids = np.asarray(ids)
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2:
        raise RequestError(f"input_ids must have shape [batch, tokens], got {list(ids.shape)}")
    batch, width = ids.shape
    if batch == 0:
        raise RequestError("the batch is empty")
    if width == 0:
        raise RequestError("input_ids is empty: the prompt has no tokens")
    ids = ids.astype(np.int64)

    length_name = "input_lengths" if kind == DECODER else "sequence_length"
    lengths = _per_item(inputs, length_name, batch)
    lengths = np.full(batch, width, np.int64) if lengths is None else lengths.astype(np.int64)
    if (lengths < 1).any():
        raise RequestError(f"{length_name} must be at least 1 (an empty prompt cannot be continued)")
    if (lengths > width).any():
        raise RequestError(f"{length_name} {int(lengths.max())} exceeds the input_ids width {width}")

    if kind == DECODER:
        out_lens = _per_item(inputs, "request_output_len", batch)
        if out_lens is None:
            raise RequestError("request_output_len is required")
        out_name = "request_output_len"
    else:
        first = inputs.get("max_output_len")
        if first is None:
            raise RequestError("max_output_len is required")
        out_lens = np.repeat(np.asarray(first).reshape(-1)[:1], batch)
        out_name = "max_output_len"
    out_lens = out_lens.astype(np.int64)
    # A negative length sent as UINT32 arrives as a huge value; both are refused here.
    if (out_lens < 1).any():
        raise RequestError(f"{out_name} must be at least 1 (got {int(out_lens.min())})")
    limit = limits.max_new_tokens
    if (out_lens > limit).any():
        raise RequestError(f"{out_name} {int(out_lens.max())} exceeds the limit of {limit} tokens")
    if kind == DECODER and limits.max_positions is not None:
        total = lengths + out_lens
        if (total > limits.max_positions).any():
            i = int(np.argmax(total))
            raise RequestError(
                f"prompt ({int(lengths[i])}) + {out_name} ({int(out_lens[i])}) = {int(total[i])} "
                f"tokens exceeds the model's {limits.max_positions} positions"
            )

    def scalar(name: str, default: float, cast: type) -> np.ndarray:
        values = _per_item(inputs, name, batch)
        if values is None:
            return np.full(batch, default)
        if cast is float:
            values = values.astype(np.float64)
            if not np.isfinite(values).all():
                raise RequestError(f"{name} must be a finite number (got {values[~np.isfinite(values)][0]})")
            return values
        if values.dtype.kind == "f":
            raise RequestError(f"{name} must be an integer")
        if values.dtype == np.uint64 and (values > np.iinfo(np.int64).max).any():
            raise RequestError(f"{name} {int(values.max())} is out of range")
        return values.astype(np.int64)

    top_k, top_p = scalar("runtime_top_k", 0, int), scalar("runtime_top_p", 0.0, float)
    temperature = scalar("temperature", 1.0, float)
    repetition = scalar("repetition_penalty", 1.0, float)
    presence = scalar("presence_penalty", 0.0, float)
    if "presence_penalty" in inputs and "repetition_penalty" in inputs:
        raise RequestError(
            "repetition_penalty and presence_penalty exclude each other (FasterTransformer takes one of them); "
            "send only one"
        )
    len_penalty = scalar("len_penalty", 0.0, float)
    for name in ("beam_search_diversity_rate", "top_p_decay", "top_p_min"):
        scalar(name, 0.0, float)  # finite, though transformers has no use for them
    seed_values = _per_item(inputs, "random_seed", batch)
    if seed_values is not None and (
        seed_values.dtype.kind not in "iub" or (seed_values.dtype.kind == "i" and (seed_values < 0).any())
    ):
        raise RequestError("random_seed must be an unsigned integer")
    seeds = [0] * batch if seed_values is None else [int(v) for v in seed_values.astype(np.uint64)]
    end_ids = scalar("end_id", limits.end_id, int)
    start_ids = scalar("start_id", limits.start_id, int)
    beam = int(scalar("beam_width", 1, int)[0])
    log_probs_in = _per_item(inputs, "is_return_log_probs", batch)
    want_log_probs = bool(log_probs_in[0]) if log_probs_in is not None else False
    bad = decode_words(inputs.get("bad_words_list"), batch, "bad_words_list")
    stop = decode_words(inputs.get("stop_words_list"), batch, "stop_words_list")

    if not 1 <= beam <= limits.max_beam_width:
        raise RequestError(f"beam_width must be between 1 and {limits.max_beam_width} (got {beam})")
    if ((top_p < 0) | (top_p > 1)).any():
        raise RequestError(
            f"runtime_top_p must be within [0, 1] (got {float(top_p.max() if top_p.max() > 1 else top_p.min())})"
        )
    if ((top_k < 0) | (top_k > limits.vocab_size)).any():
        raise RequestError(f"runtime_top_k must be at most the vocabulary size {limits.vocab_size}")
    if (temperature < 0).any():
        raise RequestError(f"temperature must not be negative (got {float(temperature.min())}; 0 = greedy)")
    low, high = REPETITION_PENALTY_RANGE
    if ((repetition < low) | (repetition > high)).any():
        raise RequestError(f"repetition_penalty must be between {low:g} and {high:g} (1.0 = off)")
    if (np.abs(presence) > PRESENCE_PENALTY_LIMIT).any():
        raise RequestError(
            f"presence_penalty must be between {-PRESENCE_PENALTY_LIMIT:g} and {PRESENCE_PENALTY_LIMIT:g}"
        )
    if (np.abs(len_penalty) > LEN_PENALTY_LIMIT).any():
        raise RequestError(
            f"len_penalty must be between {-LEN_PENALTY_LIMIT:g} and {LEN_PENALTY_LIMIT:g} "
            f"(0 = off; got {float(len_penalty[np.argmax(np.abs(len_penalty))]):g})"
        )
    # FT reads start_id only to start a T5 decoder; a decoder model's request may carry any (GPT-2's 50256).
    if kind == ENCODER_DECODER and ((start_ids < 0) | (start_ids >= limits.vocab_size)).any():
        raise RequestError(f"start_id must be a token id below {limits.vocab_size}")
    if (end_ids < 0).any():
        raise RequestError("end_id must not be negative")
    _refuse_prompt_embeddings(inputs)
    _check_ids("input_ids", np.concatenate([ids[i, : lengths[i]] for i in range(batch)]), limits.vocab_size)
    # transformers indexes logits with bad word ids; stop words are only compared, any id is fine.
    _check_ids(
        "bad_words_list", np.array([t for words in bad for word in words for t in word], np.int64), limits.vocab_size
    )

    _note_ignored(inputs)
    if kind == ENCODER_DECODER:  # a T5 prompt is its tokens plus </s>: only </s> means an empty text
        for i in range(batch):
            if (ids[i, : lengths[i]] == end_ids[i]).all():
                raise RequestError("the prompt is empty: input_ids holds nothing but the end token")

    items = []
    for i in range(batch):
        sampling = Sampling(
            end_id=int(end_ids[i]),
            start_id=int(start_ids[i]),
            top_k=int(top_k[i]),
            top_p=float(top_p[i]),
            temperature=float(temperature[i]),
            repetition_penalty=float(repetition[i]),
            presence_penalty=float(presence[i]) * float(temperature[i]),
            len_penalty=float(len_penalty[i]),
            beam_width=beam,
            random_seed=seeds[i],
            bad_words=bad[i],
            log_probs=want_log_probs,
        )
        if not sampling.do_sample:  # settings greedy and beam search ignore: let such items batch together
            sampling = replace(sampling, top_k=0, top_p=0.0, temperature=1.0, random_seed=0)
        items.append(Item(ids[i, : lengths[i]].copy(), int(out_lens[i]), sampling, stop[i]))
    return ParsedRequest(items, width, kind)


IGNORED_INPUTS = {
    "beam_search_diversity_rate": 0.0,
    "top_p_decay": 1.0,
    "top_p_min": 0.0,
    "top_p_reset_ids": None,
    "prompt_learning_task_name_ids": None,
    "ia3_tasks": None,
}
"""FT inputs without a transformers counterpart, and the value that makes them a no-op (None: any;
ftx writes no prompt tables or IA3 adapters, so no task id changes FasterTransformer's output)."""
_warned: set[str] = set()


def _refuse_prompt_embeddings(inputs: Mapping[str, np.ndarray]) -> None:
    """P-tuning prompts (``request_prompt_embedding`` + ``request_prompt_lengths``) change what FT
    generates; the python runtime cannot prepend them, so it says so rather than ignore them."""
    lengths = inputs.get("request_prompt_lengths")
    embedding = inputs.get("request_prompt_embedding")
    if (lengths is not None and np.asarray(lengths).astype(np.int64).any()) or (
        embedding is not None and np.asarray(embedding).size
    ):
        raise RequestError(
            "request_prompt_embedding / request_prompt_lengths (p-tuning prompts) are not supported "
            "by the python runtime; send the request without them"
        )


def _note_ignored(inputs: Mapping[str, np.ndarray]) -> None:
    for name, neutral in IGNORED_INPUTS.items():
        value = inputs.get(name)
        if value is None or name in _warned or neutral is None:
            continue
        if not np.allclose(np.asarray(value, np.float64), neutral):
            _warned.add(name)
            log.warning(
                "runtime.input_ignored",
                input=name,
                reason="the python runtime (transformers) has no equivalent; FasterTransformer would use it",
            )


# --------------------------------------------------------------------------- finishing rules


def ends_with_word(sequence: Sequence[int], words: Words) -> bool:
    """Whether ``sequence`` ends with one of ``words`` (cost: the longest word, not the number of words)."""
    return bool(words) and trie(words).ends_with(sequence)


def finished_length(prompt: Sequence[int] | np.ndarray, generated: Sequence[int] | np.ndarray, item: Item) -> int:
    """How many generated tokens count: up to and including end_id or a stop word, at most output_len."""
    end_id = item.sampling.end_id
    history = [int(t) for t in prompt[-MAX_WORD_TOKENS:]]
    for t, token in enumerate(generated[: item.output_len]):
        history.append(int(token))
        if int(token) == end_id or (item.stop_words and ends_with_word(history, item.stop_words)):
            return t + 1
    return min(len(generated), item.output_len)


# --------------------------------------------------------------------------- generation


@dataclass(frozen=True)
class TokenEvent:
    """One running item's new token in one decoding step (beam width 1)."""

    item: int  # index into the items given to Generator.run
    token: int
    finished: bool
    log_prob: float | None = None  # log-softmax of the model's logits at the token, when asked


class StepSink:
    """Receives decoding steps while items generate (streaming); the default ignores them."""

    def on_tokens(self, events: list[TokenEvent]) -> None:
        """One call per step with an event for every item that was still running (beam width 1)."""

    def on_beams(self, rows: list[tuple[int, np.ndarray]]) -> None:
        """One call per step of beam search: ``(item index, tokens [beam, n])``, the best running
        beams' generated tokens so far, best first."""


class _StopWords:
    """A transformers StoppingCriteria: a row stops once it ends with one of its item's stop words.

    Rows come in equal groups per item (one row, the beams, or the beam candidates ranked by beam
    search), so a row's item is its index divided by the group size.
    """

    def __init__(self, words: Sequence[Words]) -> None:
        self.words = words

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        group = max(1, input_ids.shape[0] // len(self.words))
        tails = input_ids[:, -MAX_WORD_TOKENS:].tolist()
        for r, tail in enumerate(tails):
            words = self.words[min(r // group, len(self.words) - 1)]
            if words:
                done[r] = ends_with_word(tail, words)
        return done


class _BadWords:
    """A transformers LogitsProcessor banning what would complete a bad word (FasterTransformer's
    ``bad_words_list``: the word's last token after its other tokens; a one-token word everywhere).

    transformers' own ``bad_words_ids`` checks every word at every step; the trie walks back at most
    the longest word, however many words there are.
    """

    def __init__(self, words: Words) -> None:
        self.trie = trie(words)
        self.single = sorted(self.trie.single)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        scores = scores.clone()
        if self.single:
            scores[:, self.single] = -float("inf")
        if self.trie.longest > 1:
            for r, tail in enumerate(input_ids[:, -(self.trie.longest - 1) :].tolist()):
                banned = self.trie.completions(tail) - self.trie.single
                if banned:
                    scores[r, sorted(banned)] = -float("inf")
        return scores


class _PresencePenalty:
    """A transformers LogitsProcessor: FasterTransformer's ``presence_penalty`` (its additive repetition
    penalty): every token present in the prompt or the generated text loses the penalty once, however
    often it occurs. FT subtracts it after dividing by the temperature; transformers divides after its
    processors, so the penalty comes here multiplied by the temperature (see Sampling)."""

    def __init__(self, penalty: float) -> None:
        self.penalty = penalty

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        present = scores.new_zeros(scores.shape, dtype=scores.dtype).scatter_(1, input_ids, 1.0)
        return scores - present * self.penalty


class _BeamWatcher:
    """A StoppingCriteria that never stops anything: it hands each beam-search step's best running
    beams to a sink (transformers' streamers do not support beam search)."""

    def __init__(self, items: Sequence[Item], indices: Sequence[int], beam: int, start: int, sink: StepSink) -> None:
        self.items, self.indices, self.beam, self.start, self.sink = items, indices, beam, start, sink

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        group = input_ids.shape[0] // len(self.items)
        ranked = input_ids.reshape(len(self.items), group, -1)[:, : self.beam, self.start :].cpu().numpy()
        self.sink.on_beams([(index, ranked[n].astype(np.int64)) for n, index in enumerate(self.indices)])
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


class _Streamer:
    """A transformers streamer turning each decoding step into TokenEvents for a sink.

    With log probabilities asked for, a forward hook keeps the logits each step was chosen from
    (the raw logits, as ``output_logits`` returns them at the end) and the chosen token's log
    probability is kept per row: one step's logits at a time, never all of them (``output_logits``
    would hold rows x steps x vocabulary floats).
    """

    def __init__(self, items: Sequence[Item], indices: Sequence[int], sink: StepSink) -> None:
        self.items, self.indices, self.sink = items, indices, sink
        self.generated: list[list[int]] = [[] for _ in items]
        self.chosen: list[list[float]] = [[] for _ in items]
        self.finished = [False] * len(items)
        self.logits: Any = None
        self._first = True

    def keep_logits(self, module: Any, args: Any, output: Any) -> None:
        self.logits = output.logits[:, -1, :]

    def put(self, value: Any) -> None:
        if self._first:  # generate() first hands over the prompt (or decoder start tokens)
            self._first = False
            return
        chosen = None
        if self.logits is not None:
            import torch

            log_probs = torch.log_softmax(self.logits.float(), dim=-1)
            chosen = log_probs.gather(-1, value.reshape(-1, 1).to(log_probs.device)).reshape(-1).tolist()
        self.step(value.reshape(-1).tolist(), chosen)

    def step(self, tokens: Sequence[int], chosen: Sequence[float] | None) -> bool:
        """One decoding step's token per row (and its log probability): events for the rows still running;
        whether every row has finished now."""
        events = []
        for r, (item, token) in enumerate(zip(self.items, tokens, strict=True)):
            if self.finished[r]:
                continue
            self.generated[r].append(int(token))
            if chosen is not None:
                self.chosen[r].append(chosen[r])
            done = _is_final(item, self.generated[r])
            self.finished[r] = done
            events.append(TokenEvent(self.indices[r], int(token), done, None if chosen is None else chosen[r]))
        if events:
            self.sink.on_tokens(events)
        return all(self.finished)

    def end(self) -> None:
        pass


def _is_final(item: Item, generated: Sequence[int]) -> bool:
    """Whether the last generated token ends the item (end_id, stop word or its own length)."""
    if len(generated) >= item.output_len:
        return True
    if generated and int(generated[-1]) == item.sampling.end_id:
        return True
    if not item.stop_words:
        return False
    tail = list(generated[-MAX_WORD_TOKENS:])
    if len(tail) < MAX_WORD_TOKENS:
        tail = [int(t) for t in item.prompt[len(tail) - MAX_WORD_TOKENS :]] + tail
    return ends_with_word(tail, item.stop_words)


@dataclass
class Generator:
    """Runs items through the rebuilt model: a plain-torch decoder (greedy and sampled, eager mode) or transformers'."""

    model: Any
    kind: str = DECODER
    device: Any = None
    limits: ModelLimits | None = None
    mode: str = EAGER
    """How decoding runs (:func:`~.decode_loop.decode_mode`): ``generate``, or a lean loop for beam width 1."""
    groups_run: int = field(default=0, init=False)
    decoder: LeanDecoder | None = field(default=None, init=False)
    """The lean loop's static caches and captured steps (modes in :data:`~.decode_loop.LOOP_MODES`)."""
    loader: Callable[[], Any] | None = None
    """For a plain-torch ``model``: builds transformers' model of the same files (see :meth:`transformers_model`)."""

    @classmethod
    def for_model(
        cls,
        model: Any,
        *,
        end_id: int,
        start_id: int,
        device: Any = None,
        max_positions: int | None = None,
        loader: Callable[[], Any] | None = None,
    ) -> Generator:
        """A generator for ``model`` (transformers' or a plain-torch decoder, whose ``loader`` builds transformers'
        model when a request needs it); ``max_positions`` (the source checkpoint's context size) wins over the
        rebuilt config's, which may hold transformers' default."""
        from ftx_triton.envvars import env_int

        config = model.config
        kind = ENCODER_DECODER if getattr(config, "is_encoder_decoder", False) else DECODER
        positions = (
            None
            if kind == ENCODER_DECODER
            else (
                max_positions
                or getattr(config, "n_positions", None)
                or getattr(config, "max_position_embeddings", None)
            )
        )
        budget = env_int(BATCH_TOKENS_ENV, MAX_BATCH_TOKENS, 1, 1 << 31)
        limits = ModelLimits(
            vocab_size=int(config.vocab_size),
            end_id=end_id,
            start_id=start_id,
            max_positions=int(positions) if positions else None,
            max_batch_tokens=budget,
        )
        device = device or next(model.parameters()).device
        return cls(model, kind, device, limits, decode_mode(device), loader=loader)

    def parse(self, inputs: Mapping[str, np.ndarray]) -> ParsedRequest:
        assert self.limits is not None
        return parse_request(inputs, self.limits, self.kind)

    def run(self, items: Sequence[Item], sink: StepSink | None = None) -> list[ItemResult]:
        """Generate every item; items with equal sampling settings share ``generate`` calls, as many
        per call as ``max_batch_tokens`` allows."""
        results: list[ItemResult | None] = [None] * len(items)
        for sampling, indices in group_items(items).items():
            for chunk in self._chunks(sampling, items, indices):
                group = [items[i] for i in chunk]
                for index, result in zip(chunk, self._run_group(sampling, group, chunk, sink), strict=True):
                    results[index] = result
        return [r for r in results if r is not None]

    def _chunks(self, sampling: Sampling, items: Sequence[Item], indices: Sequence[int]) -> list[list[int]]:
        """``indices`` split so that rows x (longest prompt + longest output) stays within the budget."""
        assert self.limits is not None
        chunks: list[list[int]] = []
        current: list[int] = []
        longest_prompt = longest_out = 0
        for index in indices:
            item = items[index]
            prompt, out = max(longest_prompt, len(item.prompt)), max(longest_out, item.output_len)
            if current and (len(current) + 1) * sampling.beam_width * (prompt + out) > self.limits.max_batch_tokens:
                chunks.append(current)
                current, prompt, out = [], len(item.prompt), item.output_len
            current.append(index)
            longest_prompt, longest_out = prompt, out
        return [*chunks, current] if current else chunks

    def _run_group(
        self, sampling: Sampling, items: Sequence[Item], indices: Sequence[int], sink: StepSink | None
    ) -> list[ItemResult]:
        import torch

        beam = sampling.beam_width
        max_new = max(item.output_len for item in items)
        assert self.limits is not None
        vocab = self.limits.vocab_size
        pad = 0 if self.kind == ENCODER_DECODER else sampling.pad_id(vocab)
        input_ids, attention = pad_prompts(
            [item.prompt for item in items], pad, left=self.kind == DECODER, device=self.device
        )
        processors: list[Any] = []
        if sampling.presence_penalty:
            processors.append(_PresencePenalty(sampling.presence_penalty))
        if sampling.bad_words:
            processors.append(_BadWords(sampling.bad_words))
        torch.manual_seed(sampling.random_seed)
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(sampling.random_seed)
        if self._plain_covers(sampling):
            from ftx_triton.runtime.python.torch_model import TorchDecoder

            streamer = _Streamer(items, indices, sink or StepSink())
            with torch.inference_mode():
                generated, log_probs = TorchDecoder(self.model).decode(
                    input_ids,
                    attention,
                    max_new=max_new,
                    sampling=sampling,
                    processors=processors,
                    take=streamer.step,
                    log_probs=sampling.log_probs,
                )
        else:
            generated, log_probs = self._run_transformers(
                sampling, items, indices, sink, input_ids, attention, processors, max_new
            )
        self.groups_run += 1
        results = []
        for n, item in enumerate(items):
            rows = generated[n * beam : (n + 1) * beam]
            tokens = np.full((beam, item.output_len), sampling.end_id, np.int64)
            lengths = np.zeros(beam, np.int64)
            probs = np.zeros((beam, item.output_len), np.float32) if log_probs is not None else None
            for k, row in enumerate(rows):
                length = finished_length(item.prompt, row, item)
                tokens[k, :length] = row[:length]
                lengths[k] = length
                if probs is not None and log_probs is not None:
                    probs[k, :length] = log_probs[n * beam + k, :length]
            results.append(ItemResult(tokens, lengths, probs))
        return results

    def _plain_covers(self, sampling: Sampling) -> bool:
        """Whether the plain-torch model decodes this group: greedy or sampled (beam width 1), eager mode."""
        return bool(getattr(self.model, "is_plain_torch", False)) and sampling.beam_width == 1 and self.mode == EAGER

    def transformers_model(self) -> Any:
        """The transformers model. A plain-torch ``model`` is replaced, the first time a request needs transformers
        (beam search, a decoding mode of transformers'), by the one ``loader`` builds from the same files, which
        then serves every request (it answers greedy and sampled ones exactly as the plain model did): the weights
        are held once, but for the moment of the swap."""
        if getattr(self.model, "is_plain_torch", False):
            if self.loader is None:
                raise RuntimeError("this request needs transformers' model, and the generator has no loader for it")
            log.info("runtime.transformers_model_needed", reason="beam search or a transformers decoding mode")
            self.model = self.loader()
            self.decoder = None
        return self.model

    def _run_transformers(
        self,
        sampling: Sampling,
        items: Sequence[Item],
        indices: Sequence[int],
        sink: StepSink | None,
        input_ids: Any,
        attention: Any,
        processors: list[Any],
        max_new: int,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """The group through transformers: ``generate``, or the lean loop of a transformers decoding mode."""
        import torch
        from transformers import GenerationConfig

        assert self.limits is not None
        model = self.transformers_model()
        kwargs = sampling.generate_kwargs(self.limits.vocab_size)
        if self.kind == ENCODER_DECODER:
            kwargs["decoder_start_token_id"] = sampling.start_id
        config = GenerationConfig(max_new_tokens=max_new, min_new_tokens=0, **kwargs)
        if self.mode in LOOP_MODES and sampling.beam_width == 1 and self.kind == DECODER and supports_loop(model):
            if self.decoder is None:
                self.decoder = LeanDecoder(model, self.mode)
            streamer = _Streamer(items, indices, sink or StepSink())
            with torch.inference_mode():
                return self.decoder.decode(
                    input_ids,
                    attention,
                    max_new=max_new,
                    config=config,
                    processors=processors,
                    take=streamer.step,
                    log_probs=sampling.log_probs,
                )
        return self._generate(model, sampling, items, indices, sink, input_ids, attention, config, processors)

    def _generate(
        self,
        model: Any,
        sampling: Sampling,
        items: Sequence[Item],
        indices: Sequence[int],
        sink: StepSink | None,
        input_ids: Any,
        attention: Any,
        config: Any,
        processors: list[Any],
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """The group through transformers' ``generate``: generated ids [rows, n] (prompt dropped) and, when
        asked, each token's log probability."""
        import torch
        from transformers import LogitsProcessorList, StoppingCriteriaList

        beam = sampling.beam_width
        want_scores = sampling.log_probs
        config.return_dict_in_generate = True
        config.output_scores = want_scores and beam > 1
        if self.mode == TRANSFORMERS_STATIC and beam == 1:
            config.cache_implementation = "static"  # transformers then compiles the forward (inductor)
        start = input_ids.shape[1] if self.kind == DECODER else 1  # drop the prompt / decoder start token
        criteria: list[Any] = []
        if any(item.stop_words for item in items):
            criteria.append(_StopWords([item.stop_words for item in items]))
        streamer = hook = None
        if beam == 1 and (sink is not None or want_scores):
            streamer = _Streamer(items, indices, sink or StepSink())
            if want_scores:
                hook = model.register_forward_hook(streamer.keep_logits)
        elif sink is not None:
            criteria.append(_BeamWatcher(items, indices, beam, start, sink))
        try:
            with torch.inference_mode():
                out = model.generate(
                    input_ids=input_ids,
                    attention_mask=attention,
                    generation_config=config,
                    stopping_criteria=StoppingCriteriaList(criteria) if criteria else None,
                    logits_processor=LogitsProcessorList(processors) if processors else None,
                    streamer=streamer,
                )
        finally:
            if hook is not None:
                hook.remove()
        sequences = out.sequences
        generated = sequences[:, start:].cpu().numpy().astype(np.int64)
        log_probs = None
        if want_scores and beam > 1:
            log_probs = self._beam_log_probs(model, out, sequences)
        elif want_scores and streamer is not None:
            log_probs = np.zeros((len(items), max(1, max(len(c) for c in streamer.chosen))), np.float32)
            for r, chosen in enumerate(streamer.chosen):
                log_probs[r, : len(chosen)] = chosen
        return generated, log_probs

    @staticmethod
    def _beam_log_probs(model: Any, out: Any, sequences: Any) -> np.ndarray:
        """Each beam's token scores as beam search ranked them (log-softmax, after the processors)."""
        scores = model.compute_transition_scores(sequences, out.scores, out.beam_indices, normalize_logits=False)
        return scores.float().cpu().numpy()


def group_items(items: Iterable[Item]) -> dict[Sampling, list[int]]:
    """Item indices by sampling settings (insertion order kept)."""
    groups: dict[Sampling, list[int]] = {}
    for index, item in enumerate(items):
        groups.setdefault(item.sampling, []).append(index)
    return groups


def pad_prompts(prompts: Sequence[np.ndarray], pad: int, *, left: bool, device: Any = None) -> tuple[Any, Any]:
    """A padded ``[n, max_len]`` id tensor and its attention mask (left padding for decoders)."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        n = len(prompt)
        span = slice(width - n, width) if left else slice(0, n)
        ids[row, span] = torch.from_numpy(np.asarray(prompt, np.int64))
        mask[row, span] = 1
    return ids.to(device) if device is not None else ids, mask.to(device) if device is not None else mask


# --------------------------------------------------------------------------- outputs


def build_outputs(
    request: ParsedRequest, results: Sequence[ItemResult], *, generated_so_far: int | None = None
) -> dict[str, np.ndarray]:
    """The FT output tensors of one request (int64/float32; the Triton layer casts to the config dtypes).

    ``generated_so_far`` (streaming) sizes the generated part to the tokens produced until now
    instead of the request's largest ``request_output_len``.
    """
    items = request.items
    beam = results[0].tokens.shape[0]
    max_out = max(item.output_len for item in items)
    width = max_out if generated_so_far is None else generated_so_far
    if request.kind == DECODER:
        total = request.input_len + width
        out = np.zeros((len(items), beam, total), np.int64)
        seq = np.zeros((len(items), beam), np.int64)
        for b, (item, result) in enumerate(zip(items, results, strict=True)):
            out[b, :] = item.sampling.end_id
            prompt_len = len(item.prompt)
            for k in range(beam):
                n = int(min(result.lengths[k], width))
                out[b, k, :prompt_len] = item.prompt
                out[b, k, prompt_len : prompt_len + n] = result.tokens[k, :n]
                seq[b, k] = prompt_len + n
    else:
        out = np.zeros((len(items), beam, width), np.int64)
        seq = np.zeros((len(items), beam), np.int64)
        for b, (item, result) in enumerate(zip(items, results, strict=True)):
            out[b, :] = item.sampling.end_id
            for k in range(beam):
                n = int(min(result.lengths[k], width))
                out[b, k, :n] = result.tokens[k, :n]
                seq[b, k] = n
    log_probs = np.zeros((len(items), beam, width), np.float32)
    cum = np.zeros((len(items), beam), np.float32)
    for b, result in enumerate(results):
        if result.log_probs is not None:
            n = min(width, result.log_probs.shape[1])
            log_probs[b, :, :n] = result.log_probs[:, :n]
            cum[b] = result.cum_log_probs
    outputs: dict[str, np.ndarray] = {
        "output_ids": out,
        "sequence_length": seq,
        "cum_log_probs": cum,
        "output_log_probs": log_probs,
    }
    if request.kind == DECODER:  # the prompt lengths, as FasterTransformer's GPT model answers them
        outputs["response_input_lengths"] = np.array([[len(item.prompt)] for item in items], np.int64)
    return outputs


def partial_result(item: Item, generated: Sequence[int], log_probs: Sequence[float] | None = None) -> ItemResult:
    """An ItemResult (beam 1) from the tokens streamed so far (streaming stops adding tokens to an
    item once it is finished, so all of them count), with their log probabilities when known."""
    n = min(len(generated), item.output_len)
    width = max(item.output_len, n)
    tokens = np.full((1, width), item.sampling.end_id, np.int64)
    tokens[0, :n] = list(generated)[:n]
    probs = None
    if log_probs is not None:
        probs = np.zeros((1, width), np.float32)
        probs[0, :n] = list(log_probs)[:n]
    return ItemResult(tokens, np.array([n], np.int64), probs)


def partial_beams(item: Item, rows: np.ndarray) -> ItemResult:
    """An ItemResult from the running beams of a beam-search step (each cut by the finishing rules)."""
    beam = rows.shape[0]
    tokens = np.full((beam, max(item.output_len, rows.shape[1])), item.sampling.end_id, np.int64)
    lengths = np.zeros(beam, np.int64)
    for k, row in enumerate(rows):
        length = finished_length(item.prompt, row, item)
        tokens[k, :length] = row[:length]
        lengths[k] = length
    return ItemResult(tokens, lengths)
