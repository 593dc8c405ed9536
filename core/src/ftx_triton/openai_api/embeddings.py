"""``/v1/embeddings``: an encoder-decoder deployment's (T5's) encoder output, mean-pooled.

An input's embedding is the mean of the encoder's last hidden states over the input's own tokens (its
ids as the deployment's tokenizer encodes a prompt, T5's closing ``</s>`` included; padding never
counts), in float32, as ``transformers``' ``T5EncoderModel`` gives them. It is not normalised.

Where it runs: in the deployment's ``encoder`` model, which ``ftx run MODEL --embeddings`` adds to an
encoder-decoder repository (FasterTransformer's ``T5-Encoder`` model type over the same converted files, or
the python runtime's stand-in); the endpoint sends the ids and pools the hidden states it gets back. A
deployment without it answers 501 saying how to start one; a decoder-only family has no encoder: 400.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from ftx_triton.openai_api.params import BadRequest
from ftx_triton.repository.io import ENCODER_DECODER, ENCODER_HIDDEN, ENCODER_MODEL_NAME

MAX_INPUTS = 64
"""Inputs one request may embed."""
MAX_INPUT_TOKENS = 512
"""Tokens one input may have (T5's pre-training length)."""
ENCODING_FORMATS = ("float", "base64")
DEPLOYMENT_FILE = "ftx-deployment.json"


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


class Encoder:
    """The deployment's ``encoder`` model over Triton's gRPC endpoint: ids in (right-padded, with their lengths),
    hidden states out, mean-pooled here in float32. gRPC, because Triton's HTTP JSON cannot carry the fp16 and
    bf16 hidden states, and its binary HTTP client needs gevent, which GPU images often lack."""

    def __init__(self, triton_grpc: str, vocab_size: int, max_batch: int) -> None:
        self.url = triton_grpc.removeprefix("grpc://").rstrip("/")
        self.vocab_size, self.max_batch = vocab_size, max(1, max_batch)

    def embed(self, batch: Sequence[Sequence[int]]) -> list[list[float]]:
        """One mean-pooled vector per id list, in requests of at most the model's batch size."""
        vectors: list[list[float]] = []
        for start in range(0, len(batch), self.max_batch):
            vectors += self._embed(batch[start : start + self.max_batch])
        return vectors

    def _embed(self, batch: Sequence[Sequence[int]]) -> list[list[float]]:
        import numpy as np
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        lengths = np.array([[len(ids)] for ids in batch], dtype=np.uint32)
        ids = np.zeros((len(batch), int(lengths.max())), dtype=np.uint32)
        for row, tokens in enumerate(batch):
            ids[row, : len(tokens)] = tokens
        inputs = [
            grpcclient.InferInput("input_ids", list(ids.shape), "UINT32"),
            grpcclient.InferInput("sequence_length", list(lengths.shape), "UINT32"),
        ]
        inputs[0].set_data_from_numpy(ids)
        inputs[1].set_data_from_numpy(lengths)
        client = grpcclient.InferenceServerClient(self.url)
        try:
            result = client.infer(
                ENCODER_MODEL_NAME,
                inputs,
                outputs=[grpcclient.InferRequestedOutput(ENCODER_HIDDEN)],
                client_timeout=600.0,
            )
        except InferenceServerException as exc:
            raise EncoderFault(f"the encoder model failed: {exc.message()}") from None
        finally:
            client.close()
        hidden = np.asarray(result.as_numpy(ENCODER_HIDDEN), dtype=np.float32)
        mask = (np.arange(ids.shape[1])[None, :] < lengths).astype(np.float32)[..., None]
        pooled = (hidden * mask).sum(axis=1) / mask.sum(axis=1)
        return [list(map(float, row)) for row in pooled]


class EncoderFault(Exception):
    """The encoder model answered with an error (the server's fault: the front sent checked ids)."""


class Embeddings:
    """What ``/v1/embeddings`` serves for one repository: its ``encoder`` model, or the reason there is none."""

    def __init__(self, repository: Path, triton_grpc: str | None) -> None:
        self.repository, self.triton_grpc = repository, triton_grpc
        self._encoder: Encoder | None = None

    def record(self) -> dict[str, Any]:
        try:
            record = json.loads((self.repository / DEPLOYMENT_FILE).read_text())
        except (OSError, ValueError):
            record = None
        if not isinstance(record, dict):
            raise BadRequest(
                f"this deployment has no readable {DEPLOYMENT_FILE}, so whether it serves an encoder is unknown "
                "(run `ftx run` again to rebuild the repository)",
                status=501,
                code="embeddings_unsupported",
            )
        return record

    def encoder(self) -> Encoder:
        """The encoder model's client, or a BadRequest saying why this deployment cannot embed."""
        if self._encoder is not None:
            return self._encoder
        record = self.record()
        if ENCODER_MODEL_NAME not in (record.get("models") or ()):
            family = record.get("family", "this model")
            if record.get("io_kind", ENCODER_DECODER) != ENCODER_DECODER:
                raise BadRequest(
                    f"{family} is a decoder-only model: it has no encoder to embed with "
                    "(/v1/embeddings serves encoder-decoder deployments started with --embeddings)",
                    code="embeddings_unsupported",
                )
            raise BadRequest(
                f"this {family} deployment serves no encoder model: start it with `ftx run MODEL --embeddings` "
                "for /v1/embeddings",
                status=501,
                code="embeddings_unsupported",
            )
        vocab = int((record.get("spec") or {}).get("dims", {}).get("V") or 0) or int(
            (record.get("tokenizer") or {}).get("vocab_size") or 0
        )
        if not self.triton_grpc:
            raise BadRequest(
                "this endpoint was started without Triton's gRPC address, which embeddings are read over "
                "(start it with --triton-grpc HOST:PORT)",
                status=501,
                code="embeddings_unsupported",
            )
        self._encoder = Encoder(self.triton_grpc, vocab, int(record.get("max_batch_size") or MAX_INPUTS))
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
