"""Text <-> token ids for the ``preprocessing`` and ``postprocessing`` Triton models.

This module is copied into every generated repository as ``<model>/1/ftx_textproc.py`` and
imported by the Python-backend ``model.py`` next to it, so a repository is self-contained: it
needs numpy and ``tokenizers`` or ``sentencepiece`` in the serving environment, never ftx and
never the network. Keep it free of ``ftx`` imports.

Tokenizer files live next to the model (``<model>/1/``); ids (start, end, pad) come from the
model's own spec through the model config parameters, never from a hard-coded vocabulary.

Tensors follow Triton's batching convention (``max_batch_size > 0``): every array starts with
the batch dimension. Request-level problems raise :class:`RequestError`, which the model turns
into an error response for that request only.
"""

from __future__ import annotations

import csv
import json
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # typing.Self is Python 3.11+; the serving environment may run an older Python
    from typing import Self

HF_FILES = ("tokenizer.json",)
BPE_FILES = ("vocab.json", "merges.txt")
SPIECE_FILE = "spiece.model"

DECODER = "decoder"
ENCODER_DECODER = "encoder-decoder"


class RequestError(ValueError):
    """A request this model cannot serve (bad value, missing input)."""


class TokenizerLoadError(RuntimeError):
    """The tokenizer files are missing or unreadable."""


# --------------------------------------------------------------------------- tokenizers


class Codec:
    """Encode text to ids and decode ids to text with one tokenizer."""

    kind = ""

    def encode(self, text: str, *, prompt: bool) -> list[int]:
        """Ids of ``text``; ``prompt`` adds the tokenizer's own special tokens (e.g. T5's ``</s>``)."""
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` without special tokens."""
        raise NotImplementedError

    def token_id(self, token: str) -> int | None:
        raise NotImplementedError

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError


class HFCodec(Codec):
    """A Hugging Face ``tokenizers`` tokenizer (``tokenizer.json``, or GPT-2 style vocab + merges)."""

    kind = "hf"

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._vocab_size: int | None = None

    @classmethod
    def from_dir(cls, directory: Path) -> HFCodec:
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:  # pragma: no cover - environment problem
            raise TokenizerLoadError("the 'tokenizers' package is not installed") from exc
        path = directory / "tokenizer.json"
        if path.is_file():
            try:
                return cls(Tokenizer.from_file(str(path)))
            except Exception as exc:
                raise TokenizerLoadError(f"{path} is not a valid tokenizer.json: {exc}") from exc
        vocab, merges = directory / "vocab.json", directory / "merges.txt"
        if vocab.is_file() and merges.is_file():
            from tokenizers import decoders, models, pre_tokenizers, processors

            try:
                tokenizer = Tokenizer(models.BPE.from_file(str(vocab), str(merges)))
            except Exception as exc:
                raise TokenizerLoadError(f"{vocab} / {merges} are not a valid BPE vocabulary: {exc}") from exc
            tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            tokenizer.decoder = decoders.ByteLevel()
            tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
            for token in _added_tokens(directory):
                tokenizer.add_special_tokens([token])
            return cls(tokenizer)
        raise TokenizerLoadError(f"{directory} has no tokenizer.json (nor vocab.json + merges.txt)")

    def encode(self, text: str, *, prompt: bool) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=prompt).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def token_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        """Counted once (``tokenizers`` builds the whole vocabulary to count it; the tokenizer does not change
        once loaded): the OpenAI endpoint reads it for every request."""
        if self._vocab_size is None:
            self._vocab_size = int(self.tokenizer.get_vocab_size(with_added_tokens=True))
        return self._vocab_size


class SentencePieceCodec(Codec):
    """A sentencepiece model (T5's ``spiece.model``); prompts end with ``</s>`` like T5Tokenizer."""

    kind = "sentencepiece"

    def __init__(self, processor: Any) -> None:
        self.sp = processor

    @classmethod
    def from_dir(cls, directory: Path) -> SentencePieceCodec:
        try:
            import sentencepiece
        except ImportError as exc:  # pragma: no cover - environment problem
            raise TokenizerLoadError("the 'sentencepiece' package is not installed") from exc
        path = directory / SPIECE_FILE
        if not path.is_file():
            raise TokenizerLoadError(f"{directory} has no {SPIECE_FILE}")
        processor = sentencepiece.SentencePieceProcessor()
        try:
            processor.Load(str(path))
        except Exception as exc:
            raise TokenizerLoadError(f"{path} is not a valid sentencepiece model: {exc}") from exc
        return cls(processor)

    def encode(self, text: str, *, prompt: bool) -> list[int]:
        ids = list(self.sp.EncodeAsIds(text))
        eos = self.sp.eos_id()
        if prompt and eos >= 0:
            ids.append(eos)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        size = self.sp.GetPieceSize()
        keep = [
            int(i) for i in ids if 0 <= int(i) < size and not (self.sp.IsControl(int(i)) or self.sp.IsUnknown(int(i)))
        ]
        return self.sp.DecodeIds(keep)

    def token_id(self, token: str) -> int | None:
        piece = self.sp.PieceToId(token)
        return piece if self.sp.IdToPiece(piece) == token else None

    @property
    def vocab_size(self) -> int:
        return int(self.sp.GetPieceSize())


def _added_tokens(directory: Path) -> list[Any]:
    """Special tokens declared beside a vocab.json (added_tokens.json, tokenizer_config.json)."""
    from tokenizers import AddedToken

    names: list[str] = []
    added = directory / "added_tokens.json"
    if added.is_file():
        mapping = json.loads(added.read_text())
        names += [token for token, _ in sorted(mapping.items(), key=lambda item: item[1])]
    for value in special_token_names(directory).values():
        if value not in names:
            names.append(value)
    return [AddedToken(name, special=True) for name in names]


def detect_kind(directory: Path) -> str | None:
    """``hf`` or ``sentencepiece`` from the files present (tokenizer.json wins), None if neither."""
    if (directory / "tokenizer.json").is_file() or all((directory / f).is_file() for f in BPE_FILES):
        return "hf"
    if (directory / SPIECE_FILE).is_file():
        return "sentencepiece"
    return None


def load_codec(directory: Path, kind: str = "auto") -> Codec:
    """The tokenizer in ``directory``: ``hf``, ``sentencepiece`` or ``auto`` (by the files present)."""
    directory = Path(directory)
    if kind == "auto":
        kind = detect_kind(directory) or ""
    if kind == "hf":
        return HFCodec.from_dir(directory)
    if kind == "sentencepiece":
        return SentencePieceCodec.from_dir(directory)
    raise TokenizerLoadError(
        f"{directory} holds no tokenizer (tokenizer.json, vocab.json + merges.txt or {SPIECE_FILE})"
    )


def special_token_names(directory: Path) -> dict[str, str]:
    """``{"bos"|"eos"|"pad"|"unk": token}`` from tokenizer_config.json / special_tokens_map.json."""
    names: dict[str, str] = {}
    for filename in ("special_tokens_map.json", "tokenizer_config.json"):
        path = Path(directory) / filename
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_bytes())
        except ValueError as exc:
            raise TokenizerLoadError(f"{filename} is not valid JSON ({exc})") from exc
        if not isinstance(data, Mapping):
            raise TokenizerLoadError(f"{filename} is not a JSON object (it holds a JSON {type(data).__name__})")
        for role in ("bos", "eos", "pad", "unk"):
            value = data.get(f"{role}_token")
            if isinstance(value, Mapping):
                value = value.get("content")
            if isinstance(value, str) and role not in names:
                names[role] = value
    return names


# --------------------------------------------------------------------------- word lists

MAX_WORDS = 1024
"""Stop or bad words one prompt may carry (text words, token-id words, or banned token ids)."""
MAX_WORD_TOKENS = 64
"""Tokens one stop or bad word may have."""
MAX_WORD_CHARS = 512
"""Characters one stop or bad word given as text may have."""


def encode_words(words_per_item: Sequence[Sequence[Sequence[int]]]) -> np.ndarray:
    """Per-item lists of token-id words as FasterTransformer's stop/bad words tensor ``[B, 2, W]`` (int32).

    Row 0 holds the concatenated ids of every word of an item, row 1 the cumulative end offset of
    each word, padded with -1 (ids padded with 0). An item without words is ``[[0], [-1]]``,
    which FasterTransformer reads as "no list". Empty words are left out.
    """
    rows: list[tuple[list[int], list[int]]] = []
    for words in words_per_item:
        ids: list[int] = []
        offsets: list[int] = []
        for word in words:
            if word:
                ids += [int(t) for t in word]
                offsets.append(len(ids))
        rows.append((ids, offsets))
    width = max([1] + [max(len(ids), len(offsets)) for ids, offsets in rows])
    out = np.zeros((len(rows), 2, width), dtype=np.int32)
    out[:, 1, :] = -1
    for b, (ids, offsets) in enumerate(rows):
        out[b, 0, : len(ids)] = ids
        out[b, 1, : len(offsets)] = offsets
    return out


def word_list(
    words_per_item: Sequence[Sequence[str]], codec: Codec, name: str = "words", token_ids: Sequence[Sequence[int]] = ()
) -> np.ndarray:
    """Stop/bad words given as text, tokenized (no BOS), plus one-token words given as ids
    (``token_ids``, per item), encoded by :func:`encode_words`.

    Each item holds at most :data:`MAX_WORDS` words of at most :data:`MAX_WORD_CHARS` characters and
    :data:`MAX_WORD_TOKENS` tokens, checked before anything is tokenized.
    """
    encoded = []
    for index, words in enumerate(words_per_item):
        ids = list(token_ids[index]) if index < len(token_ids) else []
        if len(words) + len(ids) > MAX_WORDS:
            raise RequestError(
                f"{name} holds {len(words) + len(ids)} words for one prompt; at most {MAX_WORDS} are accepted"
            )
        if any(len(word) > MAX_WORD_CHARS for word in words):
            raise RequestError(f"{name} holds a word longer than {MAX_WORD_CHARS} characters")
        tokenized = [codec.encode(word, prompt=False) for word in words if word]
        if any(len(word) > MAX_WORD_TOKENS for word in tokenized):
            raise RequestError(f"{name} holds a word of more than {MAX_WORD_TOKENS} tokens")
        encoded.append(tokenized + [[int(i)] for i in ids])
    return encode_words(encoded)


def strings(array: np.ndarray | None, name: str = "input", limit: int | None = None) -> list[list[str]]:
    """A ``[B, …]`` BYTES tensor as one list of non-empty strings per batch item (at most ``limit`` each,
    checked before any is decoded)."""
    if array is None:
        return []
    items = array.reshape(array.shape[0], -1) if array.ndim else array.reshape(1, 1)
    if limit is not None and items.shape[1] > limit:
        raise RequestError(f"{name} holds {items.shape[1]} words for one prompt; at most {limit} are accepted")
    return [[t for t in (_text(v, name) for v in row) if t] for row in items]


def _text(value: Any, name: str = "input") -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RequestError(f"{name} is not valid UTF-8 text (byte {exc.start} cannot be decoded)") from None
    return "" if value is None else str(value)


def csv_words(array: np.ndarray | None, name: str) -> list[list[str]]:
    """FasterTransformer's word-list strings (one CSV line of words per item, ``"Hawks, Hawks"``)
    as one list of words per item; spaces are kept, they are part of a word's tokens. A line longer
    than :data:`MAX_WORDS` words of :data:`MAX_WORD_CHARS` characters is refused before it is split; a
    line the CSV reader refuses (a word over its 131072-character field limit, a NUL) is the request's
    mistake too."""
    rows = strings(array, name, MAX_WORDS)
    longest = MAX_WORDS * (MAX_WORD_CHARS + 1)
    if any(len(line) > longest for row in rows for line in row):
        raise RequestError(f"{name} is longer than {MAX_WORDS} words of {MAX_WORD_CHARS} characters")
    try:
        return [[word for line in row for fields in csv.reader([line]) for word in fields if word] for row in rows]
    except csv.Error as exc:
        raise RequestError(
            f"{name} is not a word list this model can read ({exc}); send words as one CSV line "
            f"of at most {csv.field_size_limit()} characters a word"
        ) from None


# --------------------------------------------------------------------------- parameters


def _bool(text: str | None, default: bool = False) -> bool:
    if text is None or text == "":
        return default
    return text.strip().lower() in ("1", "true", "yes", "on")


def _int(params: Mapping[str, str], key: str) -> int | None:
    value = params.get(key, "")
    return int(value) if str(value).strip() not in ("", "none") else None


@dataclass(frozen=True)
class TextSettings:
    """What a pre/post-processing model needs to know, from its config.pbtxt parameters."""

    io_kind: str
    tokenizer_kind: str
    start_id: int
    end_id: int
    pad_id: int
    streaming: bool = False
    max_batch_size: int = 0
    max_prompt_tokens: int | None = None
    """The model's context size: a prompt longer than this is refused (None: no known limit)."""

    @classmethod
    def from_parameters(cls, params: Mapping[str, str], max_batch_size: int = 0) -> TextSettings:
        missing = [k for k in ("io_kind", "start_id", "end_id") if not str(params.get(k, "")).strip()]
        if missing:
            raise TokenizerLoadError(f"model parameters lack {', '.join(missing)}")
        end_id = _int(params, "end_id")
        assert end_id is not None
        pad_id = _int(params, "pad_id")
        return cls(
            io_kind=params["io_kind"],
            tokenizer_kind=params.get("tokenizer_kind", "auto") or "auto",
            start_id=_int(params, "start_id") or 0,
            end_id=end_id,
            pad_id=end_id if pad_id is None else pad_id,
            streaming=_bool(params.get("streaming")),
            max_batch_size=max_batch_size,
            max_prompt_tokens=_int(params, "max_prompt_tokens"),
        )

    def as_parameters(self) -> dict[str, str]:
        params = {
            "io_kind": self.io_kind,
            "tokenizer_kind": self.tokenizer_kind,
            "start_id": str(self.start_id),
            "end_id": str(self.end_id),
            "pad_id": str(self.pad_id),
            "streaming": "1" if self.streaming else "0",
        }
        if self.max_prompt_tokens is not None:
            params["max_prompt_tokens"] = str(self.max_prompt_tokens)
        return params


def model_parameters(model_config: Mapping[str, Any]) -> dict[str, str]:
    """``parameters`` of a model config (as Triton hands it to a Python model) as plain strings."""
    return {k: str(v.get("string_value", "")) for k, v in (model_config.get("parameters") or {}).items()}


# --------------------------------------------------------------------------- the two models


UINT32_MAX = 2**32 - 1
GREEDY_TOP_P = 1e-6
"""The nucleus that decodes greedily through FasterTransformer's top-p kernel (see ``logprobs``)."""
PROMPT_CHARS_PER_TOKEN = 16
"""Characters of a long prompt tokenized first to see whether it can fit the context at all: texts
average about 4 characters a token, so a prefix this generous yielding too many tokens proves the
whole prompt too long without tokenizing megabytes of it."""
_PREFIX_MARGIN = 64
"""Tokens a prefix may differ from the same stretch of the whole text (a word cut at its end)."""


def _scalar_column(inputs: Mapping[str, np.ndarray], name: str, batch: int, default: Any, dtype: Any) -> np.ndarray:
    """A ``[B, 1]`` array from an optional ``[B, 1]`` input, or the default."""
    value = inputs.get(name)
    if value is None:
        return np.full((batch, 1), default, dtype=dtype)
    value = np.asarray(value)
    if value.size == 0 or value.size % batch:
        raise RequestError(f"{name} must have one value per prompt ({batch}), got shape {list(value.shape)}")
    return value.reshape(batch, -1)[:, :1].astype(dtype)


def _finite(name: str, values: np.ndarray) -> None:
    if not np.isfinite(values).all():
        raise RequestError(f"{name} must be a finite number (got {float(values[~np.isfinite(values)][0])})")


class _TextModel:
    """What the ``preprocessing`` and ``postprocessing`` models share: a codec and the model's text settings."""

    def __init__(self, codec: Codec, settings: TextSettings) -> None:
        self.codec = codec
        self.settings = settings

    @classmethod
    def from_directory(cls, directory: Path, params: Mapping[str, str], max_batch_size: int = 0) -> Self:
        """The model of the repository folder ``directory`` (its tokenizer files) and config ``params``."""
        settings = TextSettings.from_parameters(params, max_batch_size)
        return cls(load_codec(directory, settings.tokenizer_kind), settings)


class Preprocessor(_TextModel):
    """Text inputs → FasterTransformer inputs, for either ensemble.

    The generate ensemble sends ``text_input``, ``max_tokens`` and sampling settings; FT's ensemble
    sends ``QUERY``, ``REQUEST_OUTPUT_LEN`` and CSV word lists (its sampling inputs bypass this model).
    """

    def run(self, inputs: Mapping[str, np.ndarray], wanted: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """Every output (one encoding makes them all: ``wanted`` changes nothing here)."""
        if "QUERY" in inputs:
            return self._ft_interface(inputs)
        return self._generate_interface(inputs)

    def _ft_interface(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """FasterTransformer's ensemble: ``QUERY`` [B, 1], ``REQUEST_OUTPUT_LEN`` [B, 1], word lists."""
        prompts = [" ".join(row) for row in _rows_as_text(inputs["QUERY"], "INPUT_0")]
        batch = len(prompts)
        if "REQUEST_OUTPUT_LEN" not in inputs:
            raise RequestError("the request has no INPUT_1 (output lengths)")
        lengths = self._output_lengths(_scalar_column(inputs, "REQUEST_OUTPUT_LEN", batch, 0, np.int64), "INPUT_1")
        out = self._prompts(prompts, lengths)
        out["BAD_WORDS_IDS"] = word_list(
            _pad_rows(csv_words(inputs.get("BAD_WORDS_DICT"), "INPUT_2"), batch), self.codec, "INPUT_2"
        )
        out["STOP_WORDS_IDS"] = word_list(
            _pad_rows(csv_words(inputs.get("STOP_WORDS_DICT"), "INPUT_3"), batch), self.codec, "INPUT_3"
        )
        return out

    def _generate_interface(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        s = self.settings
        text = inputs.get("text_input")
        if text is None:
            raise RequestError("the request has no text_input")
        prompts = [" ".join(row) if row else "" for row in _rows_as_text(text, "text_input")]
        batch = len(prompts)
        if "max_tokens" not in inputs:
            raise RequestError("the request has no max_tokens")
        max_tokens = self._output_lengths(_scalar_column(inputs, "max_tokens", batch, 0, np.int64), "max_tokens")
        if "stream" in inputs:
            stream = _scalar_column(inputs, "stream", batch, False, np.bool_)
            if stream.any() and not s.streaming:
                raise RequestError("this deployment does not stream; configure it with --streaming to use stream=true")
            if not stream.all() and s.streaming:
                raise RequestError(
                    "this deployment streams (configured with --streaming): send stream=true "
                    "through generate_stream or gRPC streaming"
                )
        top_k = _scalar_column(inputs, "top_k", batch, 0, np.int64)
        top_p = _scalar_column(inputs, "top_p", batch, 0.0, np.float32)
        temperature = _scalar_column(inputs, "temperature", batch, 1.0, np.float32)
        beam_width = _scalar_column(inputs, "beam_width", batch, 1, np.int64)
        repetition_penalty = _scalar_column(inputs, "repetition_penalty", batch, 1.0, np.float32)
        for name, values in (
            ("top_p", top_p),
            ("temperature", temperature),
            ("repetition_penalty", repetition_penalty),
        ):
            _finite(name, values)
        if ((top_k < 0) | (top_k > UINT32_MAX)).any():
            raise RequestError("top_k must be 0 (off) or a positive token count")
        if ((top_p < 0) | (top_p > 1)).any():
            raise RequestError("top_p must be between 0 (off) and 1")
        if (temperature <= 0).any():
            raise RequestError("temperature must be positive")
        if ((beam_width < 1) | (beam_width > UINT32_MAX)).any():
            raise RequestError("beam_width must be at least 1")
        if (repetition_penalty <= 0).any():
            raise RequestError("repetition_penalty must be positive")
        if "logprobs" in inputs:
            # FasterTransformer's greedy decoding is top-k 1, whose output_log_probs are the chosen token's
            # probability renormalized among the top 1: always 0. Its top-p kernel keeps the softmax's own
            # value, and a nucleus this small holds only the most likely token: the same tokens, true log
            # probabilities.
            wanted = _scalar_column(inputs, "logprobs", batch, False, np.bool_)
            greedy = wanted & (top_k <= 1) & (top_p == 0)
            top_k = np.where(greedy, 0, top_k)
            top_p = np.where(greedy, GREEDY_TOP_P, top_p).astype(np.float32)
        if "random_seed" in inputs:
            seed = _scalar_column(inputs, "random_seed", batch, 0, np.uint64)
        else:  # a fresh seed per request, so sampling differs between requests unless asked otherwise
            seed = np.array([[secrets.randbits(63)] for _ in range(batch)], dtype=np.uint64)

        out = self._prompts(prompts, max_tokens)
        out.update(
            {
                "runtime_top_k": top_k.astype(np.uint32),
                "runtime_top_p": top_p,
                "temperature": temperature,
                "repetition_penalty": repetition_penalty,
                "random_seed": seed,
                "beam_width": beam_width.astype(np.uint32),
                "is_return_log_probs": np.ones((batch, 1), np.bool_),
                "BAD_WORDS_IDS": word_list(
                    _pad_rows(strings(inputs.get("bad_words"), "bad_words", MAX_WORDS), batch),
                    self.codec,
                    "bad_words",
                    self._banned_ids(inputs.get("bad_token_ids"), batch),
                ),
                "STOP_WORDS_IDS": word_list(
                    _pad_rows(strings(inputs.get("stop"), "stop", MAX_WORDS), batch), self.codec, "stop"
                ),
            }
        )
        return out

    def _banned_ids(self, array: np.ndarray | None, batch: int) -> list[list[int]]:
        """``bad_token_ids`` (``[B, N]`` token ids never to generate, OpenAI's ``logit_bias`` of -100): at
        most :data:`MAX_WORDS` per prompt, each inside the vocabulary; negative ids pad a row."""
        if array is None:
            return []
        ids = np.asarray(array).reshape(batch, -1) if np.asarray(array).size else np.zeros((batch, 0), np.int64)
        if ids.shape[1] > MAX_WORDS:
            raise RequestError(f"bad_token_ids holds {ids.shape[1]} ids; at most {MAX_WORDS} are accepted")
        if ids.dtype.kind == "f":
            raise RequestError("bad_token_ids must be integer token ids")
        ids = ids.astype(np.int64)
        vocab = self.codec.vocab_size
        if (ids >= vocab).any():
            raise RequestError(f"bad_token_ids holds {int(ids.max())}, outside the vocabulary (0..{vocab - 1})")
        return [[int(i) for i in row if i >= 0] for row in ids]

    @staticmethod
    def _output_lengths(values: np.ndarray, name: str) -> np.ndarray:
        """Output lengths within [1, 2^32 - 1] (what FT's UINT32 input holds), as UINT32."""
        if (values < 1).any():
            raise RequestError(f"{name} must be at least 1 (got {int(values.min())})")
        if (values > UINT32_MAX).any():
            raise RequestError(f"{name} {int(values.max())} is too large (at most {UINT32_MAX})")
        return values.astype(np.uint32)

    def _encode(self, prompt: str) -> list[int]:
        """The prompt's ids; a prompt that cannot fit the context is refused after tokenizing a prefix."""
        limit = self.settings.max_prompt_tokens
        if limit is not None:
            head = prompt[: (limit + _PREFIX_MARGIN) * PROMPT_CHARS_PER_TOKEN]
            if len(head) < len(prompt):
                n = len(self.codec.encode(head, prompt=False))
                if n > limit + _PREFIX_MARGIN:
                    raise RequestError(
                        f"the prompt is longer than the model's context of {limit} tokens "
                        f"({len(prompt)} characters, {n}+ tokens)"
                    )
        ids = self.codec.encode(prompt, prompt=True)
        if limit is not None and len(ids) >= limit:
            raise RequestError(
                f"the prompt has {len(ids)} tokens; the model's context holds {limit} "
                "(prompt and generated tokens together)"
            )
        return ids

    def _prompts(self, prompts: Sequence[str], output_lengths: np.ndarray) -> dict[str, np.ndarray]:
        """FT's ids, lengths and output-length inputs for the prompts."""
        s = self.settings
        batch = len(prompts)
        encoded = [self._encode(p) for p in prompts]
        if any(not ids for ids in encoded):
            raise RequestError("the prompt is empty after tokenization")
        lengths = np.array([[len(ids)] for ids in encoded], dtype=np.uint32)
        input_ids = np.full((batch, int(lengths.max())), s.pad_id, dtype=np.uint32)
        for b, ids in enumerate(encoded):
            input_ids[b, : len(ids)] = ids
        return {"INPUT_ID": input_ids, "REQUEST_INPUT_LEN": lengths, "REQUEST_OUTPUT_LEN": output_lengths}


class Postprocessor(_TextModel):
    """FasterTransformer outputs (``TOKENS_BATCH``, ``sequence_length``) → ``text_output`` and ``OUTPUT``.

    ``text_output`` is the generated part: ``output_ids[b, k, start:sequence_length[b, k]]`` where
    ``start`` is the prompt length (``REQUEST_INPUT_LEN``, or FT's ``RESPONSE_INPUT_LENGTHS`` as
    fastertransformer_backend's clients send it) for decoder models and 0 for T5, whose output
    holds decoder tokens only; generation ends at the first end id. A streamed response carries
    the FT model's stream offset instead (Triton lets no step after a decoupled model read another
    model's outputs): then ``text_output`` is only the text the tokens from that offset add, so a
    stream sends every piece once. Without either, decoder text includes the prompt.
    ``OUTPUT`` is the whole sequence up to ``sequence_length`` (every token when a client sends no
    lengths), as FasterTransformer's ensemble has it. Neither drops what the tokenizer makes of a
    character whose last bytes were not generated (``\ufffd``): the text is what the ids decode to.
    """

    def _shaped(self, output_ids: np.ndarray, sequence_length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ids = np.asarray(output_ids)
        if ids.ndim == 2:  # [B, S]: a model without the beam dimension
            ids = ids[:, None, :]
        if ids.ndim != 3:
            raise RequestError(f"output_ids must be [batch, beam, length], got shape {list(ids.shape)}")
        batch, beams, width = ids.shape
        lengths = np.asarray(sequence_length).reshape(batch, -1)
        if lengths.shape[1] not in (1, beams):
            raise RequestError(f"sequence_length {list(lengths.shape)} does not match output_ids {list(ids.shape)}")
        ends = np.clip(np.broadcast_to(lengths, (batch, beams)).astype(np.int64), 0, width)
        return ids, ends

    def _per_beam(self, values: np.ndarray | None, batch: int, beams: int) -> np.ndarray | None:
        if values is None:
            return None
        values = np.asarray(values).reshape(batch, -1).astype(np.int64)
        return np.broadcast_to(values[:, :1] if values.shape[1] != beams else values, (batch, beams))

    def texts(
        self,
        output_ids: np.ndarray,
        sequence_length: np.ndarray,
        input_lengths: np.ndarray | None = None,
        *,
        whole: bool = False,
    ) -> list[list[str]]:
        """Decoded generated text per batch item and beam, up to the first end id. ``whole``: every
        token up to sequence_length, as decoded (FasterTransformer's ensemble text)."""
        ids, ends = self._shaped(output_ids, sequence_length)
        batch, beams, _ = ids.shape
        starts = self._per_beam(input_lengths if self.settings.io_kind != ENCODER_DECODER else None, batch, beams)
        result = []
        for b in range(batch):
            row = []
            for k in range(beams):
                end = int(ends[b, k])
                start = min(int(starts[b, k]), end) if starts is not None else 0
                generated = ids[b, k, start:end].tolist()
                if whole:
                    row.append(self.codec.decode(generated))
                    continue
                if self.settings.end_id in generated:
                    generated = generated[: generated.index(self.settings.end_id)]
                row.append(self.codec.decode(generated))
            result.append(row)
        return result

    def new_texts(self, output_ids: np.ndarray, sequence_length: np.ndarray, offsets: np.ndarray) -> list[list[str]]:
        """Per batch item and beam, the text that the tokens from ``offsets`` on add to what precedes
        them (the whole sequence is decoded, so pieces join exactly as the full text reads)."""
        ids, ends = self._shaped(output_ids, sequence_length)
        batch, beams, _ = ids.shape
        starts = self._per_beam(offsets, batch, beams)
        assert starts is not None
        result = []
        for b in range(batch):
            row = []
            for k in range(beams):
                tokens = ids[b, k, : int(ends[b, k])].tolist()
                start = min(max(int(starts[b, k]), 0), len(tokens))
                if self.settings.end_id in tokens[start:]:
                    tokens = tokens[: tokens.index(self.settings.end_id, start)]
                row.append(added_text(self.codec.decode(tokens[:start]), self.codec.decode(tokens)))
            result.append(row)
        return result

    def tokens(
        self,
        output_ids: np.ndarray,
        sequence_length: np.ndarray,
        log_probs: np.ndarray | None,
        starts: np.ndarray | None,
        prompt_lengths: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The best beam's generated ids from ``starts`` (stream offsets, else the prompt length; 0 for
        T5) to the first end id, and FasterTransformer's log probability of each (its
        ``output_log_probs`` counts generated positions: a decoder's prompt comes first in ``output_ids``).
        ``[B, n]`` each, ids padded with -1."""
        ids, ends = self._shaped(output_ids, sequence_length)
        batch = ids.shape[0]
        decoder = self.settings.io_kind != ENCODER_DECODER
        prompts = self._per_beam(prompt_lengths, batch, ids.shape[1]) if decoder else None
        first = self._per_beam(starts, batch, ids.shape[1])
        probs = None if log_probs is None else np.asarray(log_probs, np.float32).reshape(batch, ids.shape[1], -1)
        rows: list[tuple[list[int], list[float]]] = []
        for b in range(batch):
            prompt = int(prompts[b, 0]) if prompts is not None else 0
            start = int(first[b, 0]) if first is not None else prompt
            end = int(ends[b, 0])
            generated = ids[b, 0, start:end].tolist()
            if self.settings.end_id in generated:
                generated = generated[: generated.index(self.settings.end_id)]
            values = [0.0] * len(generated)
            if probs is not None and (prompts is not None or not decoder):
                at = start - prompt
                window = probs[b, 0, max(at, 0) : at + len(generated)].tolist()
                values[len(values) - len(window) :] = window
            rows.append((generated, values))
        width = max([1] + [len(r[0]) for r in rows])
        out_ids = np.full((batch, width), -1, np.int64)
        out_probs = np.zeros((batch, width), np.float32)
        for b, (generated, values) in enumerate(rows):
            out_ids[b, : len(generated)] = generated
            out_probs[b, : len(values)] = values
        return out_ids, out_probs

    def run(self, inputs: Mapping[str, np.ndarray], wanted: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """``text_output``, ``OUTPUT`` and the token outputs, or only those in ``wanted`` (what the caller
        asked for: the text ensemble reads ``text_output`` and the tokens, the classic ensemble ``OUTPUT``
        alone, and a streamed answer passes here once per token, so each decode skipped counts)."""
        wanted = {"text_output", "OUTPUT", TOKEN_IDS, TOKEN_LOG_PROBS} if wanted is None else set(wanted)
        if "TOKENS_BATCH" not in inputs:
            raise RequestError("the request has no TOKENS_BATCH")
        ids = np.asarray(inputs["TOKENS_BATCH"])
        lengths = inputs.get("sequence_length")
        if lengths is None:  # fastertransformer_backend's clients may send the ids alone: decode them all
            lengths = np.full(ids.shape[:-1], ids.shape[-1], np.int64)
        prompt_lengths = inputs.get("REQUEST_INPUT_LEN", inputs.get("RESPONSE_INPUT_LENGTHS"))
        offsets = inputs.get(STREAM_OFFSET)
        result = {}
        if "text_output" in wanted:
            if offsets is not None:
                texts = self.new_texts(ids, lengths, offsets)
            else:
                texts = self.texts(ids, lengths, prompt_lengths)
            result["text_output"] = _as_bytes(texts)
        if "OUTPUT" in wanted:
            result["OUTPUT"] = _as_bytes(self.texts(ids, lengths, whole=True))
        if TOKEN_IDS in wanted or TOKEN_LOG_PROBS in wanted:
            result[TOKEN_IDS], result[TOKEN_LOG_PROBS] = self.tokens(
                ids, lengths, inputs.get("output_log_probs"), offsets, prompt_lengths
            )
        return result


STREAM_OFFSET = "ftx_stream_offset"
TOKEN_IDS = "output_token_ids"
TOKEN_LOG_PROBS = "output_token_log_probs"
_INCOMPLETE = "\ufffd"
"""What a decoder makes of a character whose bytes have not all been generated yet."""


def added_text(before: str, after: str) -> str:
    """What ``after`` (the text of a longer token sequence) adds to ``before``.

    A trailing incomplete character is held back until its last byte arrives. Should decoding
    rewrite the end of ``before`` (a tokenizer's clean-up of spaces), what was sent stays sent and
    only the text beyond its length is new.
    """
    before, after = before.rstrip(_INCOMPLETE), after.rstrip(_INCOMPLETE)
    return after[len(before) :]


def _as_bytes(texts: list[list[str]]) -> np.ndarray:
    return np.array([[t.encode("utf-8") for t in row] for row in texts], dtype=np.object_)


def _rows_as_text(array: np.ndarray, name: str = "input") -> list[list[str]]:
    array = np.asarray(array, dtype=np.object_)
    if array.ndim == 0:
        array = array.reshape(1, 1)
    elif array.ndim == 1:
        array = array.reshape(-1, 1)
    return [[_text(v, name) for v in row.reshape(-1)] for row in array]


def _pad_rows(rows: list[list[str]], batch: int) -> list[list[str]]:
    return rows + [[] for _ in range(batch - len(rows))] if len(rows) < batch else rows[:batch]


def build_processor(role: str, directory: Path, params: Mapping[str, str], max_batch_size: int = 0) -> Any:
    """The processor for a model role (``preprocessing`` or ``postprocessing``)."""
    if role == "preprocessing":
        return Preprocessor.from_directory(directory, params, max_batch_size)
    if role == "postprocessing":
        return Postprocessor.from_directory(directory, params, max_batch_size)
    raise TokenizerLoadError(f"unknown text model role {role!r}")


def outputs_in_order(result: Mapping[str, np.ndarray], names: Iterable[str]) -> list[tuple[str, np.ndarray]]:
    """The result tensors a model config declares, in its order (extra results are dropped)."""
    return [(name, result[name]) for name in names if name in result]
