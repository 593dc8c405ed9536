"""``/v1/embeddings``: an encoder-decoder deployment's (T5's) encoder output, mean-pooled.

An input's embedding is the mean of the encoder's last hidden states over the input's own tokens (its
ids as the deployment's tokenizer encodes a prompt, T5's closing ``</s>`` included; padding never
counts), in float32, as ``transformers``' ``T5EncoderModel`` gives them. It is not normalised.

Where it runs: on the python runtime the endpoint rebuilds the encoder from the deployment's converted
files (``model_checkpoint_path``; the same files the served model reads) on the CPU, once, at the first
request. On the fastertransformer runtime the answer is 501: the pinned backend has a ``T5-Encoder``
model type, but ftx's repositories do not deploy it yet. A decoder-only family has no encoder: 400.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

from ftx_triton.openai_api.params import BadRequest

if TYPE_CHECKING:
    from ftx_triton.conversion.family import Family

MAX_INPUTS = 64
"""Inputs one request may embed."""
MAX_INPUT_TOKENS = 512
"""Tokens one input may have (T5's pre-training length)."""
ENCODING_FORMATS = ("float", "base64")
DEPLOYMENT_FILE = "ftx-deployment.json"
ENCODER_IO = "encoder-decoder"


@dataclass(frozen=True)
class EmbeddingRequest:
    """A checked ``/v1/embeddings`` body: the inputs (text, or token ids) and the answer's encoding."""

    inputs: list[str | list[int]]
    encoding_format: str


def _token_list(value: Any) -> TypeGuard[list[int]]:
    return (
        isinstance(value, list) and bool(value) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)
    )


def parse_embedding_request(body: Mapping[str, Any]) -> EmbeddingRequest:
    """The request's inputs and format, or a BadRequest naming the field that is wrong."""
    raw = body.get("input")
    inputs: list[str | list[int]]
    if isinstance(raw, str):
        inputs = [raw]
    elif _token_list(raw):
        inputs = [list(raw)]
    elif isinstance(raw, list) and raw and all(isinstance(x, str) or _token_list(x) for x in raw):
        inputs = list(raw)
    else:
        raise BadRequest(
            "input must be a string, a list of strings, a list of token ids or a list of such lists (non-empty)",
            "input",
        )
    if len(inputs) > MAX_INPUTS:
        raise BadRequest(f"{len(inputs)} inputs is more than the {MAX_INPUTS} one request may embed", "input")
    if any(isinstance(x, str) and not x for x in inputs):
        raise BadRequest("an input is the empty string; send text to embed", "input")
    fmt = body.get("encoding_format", "float")
    if fmt not in ENCODING_FORMATS:
        raise BadRequest(
            f"encoding_format must be one of {', '.join(ENCODING_FORMATS)}, not {fmt!r}", "encoding_format"
        )
    if body.get("dimensions") is not None:
        raise BadRequest(
            "dimensions is not supported: the embedding has the encoder's width (d_model); leave it out", "dimensions"
        )
    return EmbeddingRequest(inputs, str(fmt))


def mean_pool(hidden: Any, mask: Any) -> Any:
    """The mean of ``hidden`` (batch, tokens, width) over the tokens ``mask`` (batch, tokens) marks, in float32."""
    weights = mask.to(hidden.dtype).unsqueeze(-1)
    return ((hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)).float()


class Encoder:
    """The deployment's encoder, rebuilt from its converted files on the CPU (the python runtime's model)."""

    def __init__(self, model: Any, vocab_size: int) -> None:
        self.model, self.vocab_size = model, vocab_size
        self.lock = threading.Lock()

    @classmethod
    def load(cls, family: Family, checkpoint: Path, data_type: str | None) -> Encoder:
        from ftx_triton.runtime.python.hf_model import load_model

        loaded = load_model(family, checkpoint, device="cpu", data_type=data_type)
        return cls(loaded.model.get_encoder(), int(loaded.config.vocab_size))

    def embed(self, batch: Sequence[Sequence[int]]) -> list[list[float]]:
        """One mean-pooled vector per id list (padded with 0 and masked out)."""
        import torch

        width = max(len(ids) for ids in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, tokens in enumerate(batch):
            ids[row, : len(tokens)] = torch.tensor(list(tokens), dtype=torch.long)
            mask[row, : len(tokens)] = 1
        with self.lock, torch.inference_mode():
            hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        return [list(map(float, row)) for row in mean_pool(hidden, mask).tolist()]


class Embeddings:
    """What ``/v1/embeddings`` serves for one repository: an encoder, or the reason there is none."""

    def __init__(self, repository: Path) -> None:
        self.repository = repository
        self._encoder: Encoder | None = None
        self._load = threading.Lock()

    def record(self) -> dict[str, Any]:
        try:
            record = json.loads((self.repository / DEPLOYMENT_FILE).read_text())
        except (OSError, ValueError):
            record = None
        if not isinstance(record, dict):
            raise BadRequest(
                f"this deployment has no readable {DEPLOYMENT_FILE}, so which encoder serves embeddings is unknown "
                "(run `ftx run` again to rebuild the repository)",
                status=501,
                code="embeddings_unsupported",
            )
        return record

    def encoder(self) -> Encoder:
        """The encoder (loaded once), or a BadRequest saying why this deployment cannot embed."""
        with self._load:
            if self._encoder is not None:
                return self._encoder
            record = self.record()
            from ftx_triton.plugins import load_host

            family = load_host().family(str(record.get("family")))
            if family.triton_io != ENCODER_IO:
                raise BadRequest(
                    f"{family.name} is a decoder-only model: it has no encoder to embed with "
                    "(/v1/embeddings serves encoder-decoder deployments such as T5)",
                    code="embeddings_unsupported",
                )
            if record.get("runtime") != "python":
                raise BadRequest(
                    "embeddings are served on the python runtime only: the pinned FasterTransformer backend has a "
                    "T5-Encoder model type, but ftx does not deploy it yet (serve with `ftx run MODEL --runtime "
                    "python` for /v1/embeddings)",
                    status=501,
                    code="embeddings_unsupported",
                )
            self._encoder = Encoder.load(family, Path(str(record.get("checkpoint"))), record.get("data_type"))
            return self._encoder


def vectors_payload(vectors: Sequence[Sequence[float]], fmt: str) -> list[dict[str, Any]]:
    """OpenAI's ``data`` list: ``{"object": "embedding", "index", "embedding"}``, float lists or base64 of
    little-endian float32 (what the ``openai`` client asks for and decodes)."""
    import numpy as np

    data = []
    for index, vector in enumerate(vectors):
        value: Any = list(vector)
        if fmt == "base64":
            value = base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
        data.append({"object": "embedding", "index": index, "embedding": value})
    return data


def token_ids(request: EmbeddingRequest, encode: Any, vocab_size: int) -> list[list[int]]:
    """Each input's ids (text encoded as a prompt); a BadRequest for ids outside the vocabulary or too many."""
    out = []
    for number, item in enumerate(request.inputs):
        ids = encode(item) if isinstance(item, str) else list(item)
        if any(not 0 <= i < vocab_size for i in ids):
            raise BadRequest(f"input[{number}] holds token ids outside the vocabulary [0, {vocab_size})", "input")
        if len(ids) > MAX_INPUT_TOKENS:
            raise BadRequest(
                f"input[{number}] is {len(ids)} tokens, more than the {MAX_INPUT_TOKENS} one input may have", "input"
            )
        out.append(ids)
    return out
