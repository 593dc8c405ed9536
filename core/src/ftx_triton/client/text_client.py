"""The text interface of a served model, over either of Triton's protocols.

A model repository's ``text`` model speaks Triton's generate-extension names (``text_input``,
``max_tokens`` … → ``text_output``); the raw FasterTransformer names are accepted too. This module
finds which inputs carry each role (:func:`text_interface`, from the model's metadata and config),
and talks to the server over HTTP (:class:`HttpTriton`, the generate extension's ``/generate`` and
``/generate_stream`` routes, stdlib only). ``ftx generate`` and the OpenAI-compatible endpoint use it;
the gRPC path lives beside ``ftx generate``.
"""

from __future__ import annotations

import http.client
import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from ftx_triton.errors import ServeError
from ftx_triton.repository.io import STREAM_OFFSET

# Roles of the text interface and the input names that may carry them (generate-extension
# names first, then FasterTransformer's own).
ROLES: dict[str, tuple[str, ...]] = {
    "prompt": ("text_input", "INPUT_0", "prompt"),
    "max_tokens": ("max_tokens", "request_output_len", "INPUT_1"),
    "temperature": ("temperature",),
    "top_k": ("top_k", "runtime_top_k"),
    "top_p": ("top_p", "runtime_top_p"),
    "repetition_penalty": ("repetition_penalty",),
    "seed": ("random_seed",),
    "beam_width": ("beam_width",),
    "stop": ("stop",),
    "bad_words": ("bad_words",),
    "bad_token_ids": ("bad_token_ids",),
    "logprobs": ("logprobs",),
    "stream": ("stream",),
}
TEXT_OUTPUTS = ("text_output", "OUTPUT_0")
TOKEN_IDS = "output_token_ids"
TOKEN_LOG_PROBS = "output_token_log_probs"


@dataclass(frozen=True)
class Answer:
    """One answer of the text model: its text (the best beam's; ``texts`` has every beam's) and, where the
    model gives them, the generated token ids that text holds and their log probabilities."""

    text: str
    token_ids: tuple[int, ...] | None = None
    log_probs: tuple[float, ...] | None = None
    texts: tuple[str, ...] = ()

    @classmethod
    def of(cls, event: Mapping[str, Any], output: str) -> Answer:
        texts = tuple(str(t) for t in _flat(event.get(output, "")))
        ids = event.get(TOKEN_IDS)
        probs = event.get(TOKEN_LOG_PROBS)
        token_ids = None if ids is None else tuple(int(i) for i in _flat(ids) if int(i) >= 0)
        log_probs = None
        if token_ids is not None and probs is not None:
            log_probs = tuple(float(p) for p in _flat(probs))[: len(token_ids)]
        return cls(texts[0] if texts else "", token_ids, log_probs, texts)


def _flat(value: Any) -> list[Any]:
    """A generate-extension output as a flat list (one element comes as a scalar, several as an array)."""
    if isinstance(value, list):
        return [v for item in value for v in _flat(item)]
    return [value]


_NUMPY = {
    "BYTES": "object",
    "BOOL": "bool",
    "INT32": "int32",
    "INT64": "int64",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "FP32": "float32",
    "FP64": "float64",
    "FP16": "float16",
}


@dataclass(frozen=True)
class TextInterface:
    """Which inputs of a served model carry each role, with their Triton types and shapes."""

    model: str
    inputs: Mapping[str, tuple[str, str, tuple[int, ...]]]  # role -> (name, datatype, shape)
    output: str
    decoupled: bool
    continues_prompt: bool = True
    """A decoder model continues the prompt; an encoder-decoder (T5) answers it with new text."""
    streams_pieces: bool = False
    """Each streamed response holds only its new text (the ensemble reads the FT model's stream
    offset), rather than all the text so far."""
    gives_tokens: bool = False
    """The model answers the generated token ids and their log probabilities beside the text."""

    def tensors(self, values: Mapping[str, Any], module: Any) -> list[Any]:
        """tritonclient InferInputs for the given role values (roles the model lacks are skipped)."""
        import numpy as np

        out = []
        for role, value in values.items():
            if value is None or role not in self.inputs:
                continue
            name, datatype, shape = self.inputs[role]
            items = list(value) if isinstance(value, list | tuple) else [value]
            last = len(shape) - 1  # a list fills the last dimension (metadata shapes start with the batch's -1)
            full = tuple(len(items) if d < 0 and i == last else 1 if d < 0 else d for i, d in enumerate(shape)) or (1,)
            if datatype == "BYTES":
                array = np.array([str(v).encode("utf-8") for v in items], dtype=np.object_)
            else:
                array = np.array(items, dtype=_NUMPY.get(datatype, "float32"))
            tensor = module.InferInput(name, list(full), datatype)
            tensor.set_data_from_numpy(array.reshape(full))
            out.append(tensor)
        return out

    def payload(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The generate extension's JSON body: input name -> value (roles the model lacks are skipped)."""
        return {
            self.inputs[role][0]: value for role, value in values.items() if value is not None and role in self.inputs
        }


def text_interface(client: Any, model: str) -> TextInterface:
    """Read a served model's metadata and config and find its text interface."""
    meta = client.get_model_metadata(model, as_json=True)
    config = client.get_model_config(model, as_json=True).get("config", {})
    declared = {i["name"]: (i["datatype"], tuple(int(d) for d in i.get("shape", ()))) for i in meta.get("inputs", ())}
    inputs = {}
    for role, names in ROLES.items():
        for name in names:
            if name in declared:
                datatype, shape = declared[name]  # metadata shapes include the batch dimension (-1)
                inputs[role] = (name, datatype, shape)
                break
    outputs = [o["name"] for o in meta.get("outputs", ())]
    output = next((n for n in TEXT_OUTPUTS if n in outputs), None)
    if "prompt" not in inputs or output is None:
        raise ServeError(
            f"model {model!r} has no text interface (inputs {', '.join(declared) or 'none'})",
            hint="send text to the 'text' model; the raw 'fastertransformer' model takes token ids",
        )
    configs = [config, *_step_configs(client, config)]
    decoupled = any((c.get("model_transaction_policy") or {}).get("decoupled") for c in configs)
    encoder_decoder = any(i.get("name") == "max_output_len" for c in configs for i in c.get("input", ()))
    streams_pieces = any(
        STREAM_OFFSET in (step.get("input_map") or {})
        for step in (config.get("ensemble_scheduling") or {}).get("step", ())
    )
    return TextInterface(
        model,
        inputs,
        output,
        decoupled,
        continues_prompt=not encoder_decoder,
        streams_pieces=streams_pieces,
        gives_tokens=TOKEN_IDS in outputs and (streams_pieces or not decoupled),
    )


def _step_configs(client: Any, config: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Configs of an ensemble's steps (Triton streams an ensemble whose step is decoupled)."""
    configs = []
    for step in (config.get("ensemble_scheduling") or {}).get("step", ()):
        try:
            configs.append(client.get_model_config(step["model_name"], as_json=True).get("config", {}))
        except Exception:  # noqa: BLE001 - a step we cannot read (either protocol's error) tells us nothing
            continue
    return configs


def first_text(array: Any) -> str:
    import numpy as np

    if array is None:
        return ""
    flat = np.asarray(array, dtype=np.object_).reshape(-1)
    if not flat.size:
        return ""
    value = flat[0]
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def sampling_values(
    max_tokens: int, temperature: float | None, top_k: int | None, top_p: float | None
) -> dict[str, Any]:
    """Role values for a request; a temperature alone samples from the whole distribution (top-p 1)."""
    values: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature, "top_k": top_k, "top_p": top_p}
    if temperature is not None and temperature > 0 and top_k is None and top_p is None:
        values["top_p"] = 1.0
    return values


MODEL_FAULT = re.compile(r"\bfailed: [A-Z]\w*(?:Error|Exception): ")
"""How ftx's models word a fault of their own (``generation failed: RuntimeError: …``) rather than a
refusal of the request; a stream's error event carries no status, only this text."""


class HttpError(Exception):
    """An HTTP error answer of the server (status and its message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


def not_http(url: str, hint: str | None = None) -> ServeError:
    """The error for a server at ``url`` whose answer is not HTTP/1.1 (a gRPC port answers with HTTP/2 frames)."""
    return ServeError(
        f"the server at {url} does not answer HTTP/1.1 (its answer has no HTTP status line): "
        "it may be Triton's gRPC port",
        hint=hint
        or "pass the HTTP address `ftx run` printed with --url http://HOST:PORT "
        "(a gRPC address goes without http://, as HOST:PORT; `ftx ps` lists both)",
    )


_MAX_ANSWER_BYTES = 64 << 20
"""The largest non-streamed answer read (a generated text is far smaller)."""
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # local servers: never via a proxy


class HttpTriton:
    """Triton's HTTP endpoint: metadata, config and the generate extension (``base`` = ``http://host:port``)."""

    def __init__(self, base: str, timeout_s: float = 600.0) -> None:
        self.base = base.rstrip("/")
        if "://" not in self.base:
            self.base = "http://" + self.base
        self.timeout_s = timeout_s

    def _open(self, path: str, body: Mapping[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.base + path,
            data=data,
            method="POST" if data else "GET",
            headers={"Content-Type": "application/json"} if data else {},
        )
        try:
            return _OPENER.open(request, timeout=self.timeout_s)
        except urllib.error.HTTPError as exc:
            text = exc.read().decode("utf-8", "replace")
            unframed = text.strip().removeprefix("data:")  # generate_stream frames its error as an event
            try:
                text = json.loads(unframed).get("error", text)
            except (ValueError, AttributeError):
                pass
            # tritonserver answers a stream whose first response failed with 400, whatever the failure
            status = 500 if exc.code == 400 and MODEL_FAULT.search(str(text)) else exc.code
            raise HttpError(status, str(text)) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ServeError(
                f"cannot reach Triton's HTTP endpoint at {self.base}: {getattr(exc, 'reason', exc)}",
                hint="start a server (`ftx run MODEL --detach`), check `ftx ps`, and pass the HTTP "
                "address `ftx run` printed with --url http://HOST:PORT",
            ) from None
        except http.client.HTTPException:
            raise not_http(self.base) from None

    def _json(self, path: str, body: Mapping[str, Any] | None, kind: type) -> Any:
        """The answer to ``path`` as JSON of ``kind``; anything else is a ServeError saying this is no Triton."""
        with self._open(path, body) as response:
            raw = response.read(_MAX_ANSWER_BYTES + 1)
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = None
        if not isinstance(answer, kind):
            shown = raw[:60].decode("utf-8", "replace").encode("unicode_escape").decode("ascii")
            raise ServeError(
                f"the server at {self.base} is not Triton's HTTP endpoint: {path} answered "
                f"{'more than 64 MiB' if len(raw) > _MAX_ANSWER_BYTES else repr(shown)}, "
                f"not a JSON {'object' if kind is dict else 'array'}",
                hint="pass the HTTP address `ftx run` printed (Triton's HTTP port, not its metrics "
                "or OpenAI port) with --url http://HOST:PORT; `ftx ps` lists them",
            )
        return answer

    def get_json(self, path: str) -> Any:
        return self._json(path, None, dict)

    def post_json(self, path: str, body: Mapping[str, Any]) -> Any:
        """POST ``body`` to ``path`` (``/v2/models/M/infer``, ``…/generate``); the JSON object it answers."""
        return self._json(path, body, dict)

    # the two calls text_interface() makes, shaped like tritonclient's as_json answers
    def get_model_metadata(self, model: str, as_json: bool = True) -> Mapping[str, Any]:
        return self.get_json(f"/v2/models/{quote(model, safe='')}")

    def get_model_config(self, model: str, as_json: bool = True) -> Mapping[str, Any]:
        return {"config": self.get_json(f"/v2/models/{quote(model, safe='')}/config")}

    def unready(self, model: str) -> str | None:
        """Why ``model`` cannot answer now (Triton not live or not ready, the model not ready, no answer), or
        None when it can."""
        for path, what in (
            ("/v2/health/ready", "Triton is not ready"),
            (f"/v2/models/{quote(model, safe='')}/ready", f"the model {model!r} is not ready"),
        ):
            try:
                with self._open(path) as response:
                    if response.status != 200:
                        return what
            except HttpError:
                return what
            except ServeError:
                return f"Triton does not answer at {self.base}"
        return None

    def models(self) -> list[str]:
        """Names of the models the server has loaded (the repository index, READY only)."""
        index = self._json("/v2/repository/index", {}, list)
        return [str(m["name"]) for m in index if isinstance(m, dict) and m.get("state") == "READY" and "name" in m]

    def generate(self, iface: TextInterface, values: Mapping[str, Any]) -> str:
        """One ``/generate`` request; the model's text output (the best beam's)."""
        return self.answer(iface, values).text

    def answer(self, iface: TextInterface, values: Mapping[str, Any]) -> Answer:
        """One ``/generate`` request: the text with the token ids and log probabilities, where given."""
        answer = self._json(f"/v2/models/{quote(iface.model, safe='')}/generate", iface.payload(values), dict)
        return Answer.of(answer, iface.output)

    def generate_stream(self, iface: TextInterface, values: Mapping[str, Any]) -> Iterator[str]:
        """``/generate_stream``: the text of each server-sent event as it arrives."""
        for answer in self.answer_stream(iface, values):
            yield answer.text

    def answer_stream(self, iface: TextInterface, values: Mapping[str, Any]) -> Iterator[Answer]:
        """``/generate_stream``: each server-sent event as an :class:`Answer` as it arrives."""
        with self._open(f"/v2/models/{quote(iface.model, safe='')}/generate_stream", iface.payload(values)) as response:
            for raw in response:
                data = sse_data(raw)
                if data is None:
                    continue
                try:
                    event = json.loads(data)
                except ValueError:
                    event = None
                if not isinstance(event, dict):
                    raise ServeError(
                        f"the server at {self.base} is not Triton's HTTP endpoint: its stream sent "
                        f"data: {data[:60]!r}, not a JSON event",
                        hint="pass the HTTP address `ftx run` printed with --url http://HOST:PORT",
                    )
                if "error" in event:
                    message = str(event["error"])
                    raise HttpError(500 if MODEL_FAULT.search(message) else 400, message)
                yield Answer.of(event, iface.output)


def sse_data(raw: bytes | str) -> str | None:
    """The payload of one line of a server-sent event stream (``data: …``, stripped); None for any other line
    (blank separators, ``: comment`` lines)."""
    line = (raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw).strip()
    return line[len("data:") :].strip() if line.startswith("data:") else None


class PieceJoiner:
    """New text from successive stream answers, the whole text starting with the prompt for a decoder.

    ftx's streaming ensemble sends each new piece once (``iface.streams_pieces``); one without stream
    offsets sends the whole text so far, and a classic one only the continuation."""

    def __init__(self, iface: TextInterface, prompt: str) -> None:
        self.iface, self.prompt, self.printed = iface, prompt, ""

    def add(self, text: str) -> str:
        """The new piece that answer ``text`` adds ("" when none)."""
        iface = self.iface
        if not self.printed and iface.continues_prompt and (iface.streams_pieces or not text.startswith(self.prompt)):
            text = self.prompt + text
        if iface.streams_pieces and self.printed:
            piece = text
        else:
            piece = text.removeprefix(self.printed) if text.startswith(self.printed) else text
        self.printed += piece
        return piece


def pieces(texts: Iterator[str], iface: TextInterface, prompt: str) -> Iterator[str]:
    """The non-empty new pieces of successive stream answers (see :class:`PieceJoiner`)."""
    joiner = PieceJoiner(iface, prompt)
    for text in texts:
        piece = joiner.add(text)
        if piece:
            yield piece
