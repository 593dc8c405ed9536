"""After ``ftx run`` serves: print how to reach the server, then generate once, detach or serve until stopped.

Also ``ftx generate MODEL PROMPT``: one request through the ensemble's text interface
(``text_input``, ``max_tokens`` … → ``text_output``) of a running server, over gRPC, printing
tokens as they stream when ``--stream`` is given.
"""

from __future__ import annotations

import json
import queue
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from ftx.cli.common import FtxCommand, say
from ftx.errors import ServeError
from ftx.triton.io import STREAM_OFFSET

EXAMPLE_PROMPT = "Once upon a time"
EXAMPLE_TOKENS = 16

# Roles of the text interface and the input names that may carry them (generate-extension
# names first, then FasterTransformer's own).
ROLES: dict[str, tuple[str, ...]] = {
    "prompt": ("text_input", "INPUT_0", "prompt"),
    "max_tokens": ("max_tokens", "request_output_len", "INPUT_1"),
    "temperature": ("temperature",),
    "top_k": ("top_k", "runtime_top_k"),
    "top_p": ("top_p", "runtime_top_p"),
    "stream": ("stream",),
}
TEXT_OUTPUTS = ("text_output", "OUTPUT_0")
_NUMPY = {"BYTES": "object", "BOOL": "bool", "INT32": "int32", "INT64": "int64", "UINT32": "uint32",
          "UINT64": "uint64", "FP32": "float32", "FP64": "float64", "FP16": "float16"}


# --------------------------------------------------------------------------- the client


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

    def tensors(self, values: Mapping[str, Any], module: Any) -> list[Any]:
        """tritonclient InferInputs for the given role values (roles the model lacks are skipped)."""
        import numpy as np

        out = []
        for role, value in values.items():
            if value is None or role not in self.inputs:
                continue
            name, datatype, shape = self.inputs[role]
            full = tuple(1 if d < 0 else d for d in shape) or (1,)
            if datatype == "BYTES":
                array = np.array([str(value).encode("utf-8")], dtype=np.object_)
            else:
                array = np.array([value], dtype=_NUMPY.get(datatype, "float32"))
            tensor = module.InferInput(name, list(full), datatype)
            tensor.set_data_from_numpy(array.reshape(full))
            out.append(tensor)
        return out


def _grpc_target(url: str) -> str:
    return url.removeprefix("grpc://")


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
        raise ServeError(f"model {model!r} has no text interface (inputs {', '.join(declared) or 'none'})",
                         hint="send text to the 'ensemble' model; the raw 'fastertransformer' model takes token ids")
    configs = [config, *_step_configs(client, config)]
    decoupled = any((c.get("model_transaction_policy") or {}).get("decoupled") for c in configs)
    encoder_decoder = any(i.get("name") == "max_output_len" for c in configs for i in c.get("input", ()))
    pieces = any(STREAM_OFFSET in (step.get("input_map") or {})
                 for step in (config.get("ensemble_scheduling") or {}).get("step", ()))
    return TextInterface(model, inputs, output, decoupled, continues_prompt=not encoder_decoder,
                         streams_pieces=pieces)


def _step_configs(client: Any, config: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Configs of an ensemble's steps (Triton streams an ensemble whose step is decoupled)."""
    from tritonclient.utils import InferenceServerException

    configs = []
    for step in (config.get("ensemble_scheduling") or {}).get("step", ()):
        try:
            configs.append(client.get_model_config(step["model_name"], as_json=True).get("config", {}))
        except InferenceServerException:  # a step we cannot read: it tells us nothing
            continue
    return configs


def _first_text(array: Any) -> str:
    import numpy as np

    if array is None:
        return ""
    flat = np.asarray(array, dtype=np.object_).reshape(-1)
    if not flat.size:
        return ""
    value = flat[0]
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _client_error(exc: Exception, url: str, model: str) -> ServeError:
    text = str(exc).strip() or type(exc).__name__
    if "failed to connect" in text.lower() or "unavailable" in text.lower() or "connection" in text.lower():
        return ServeError(f"cannot reach a Triton gRPC endpoint at {url}: {text}",
                          hint="start a server (`ftx run MODEL --detach`), check `ftx ps`, and pass the gRPC "
                               "address with --url HOST:PORT")
    if "unknown model" in text.lower() or "not found" in text.lower():
        return ServeError(f"the server at {url} has no model {model!r}: {text}",
                          hint="the text model is 'ensemble'")
    return ServeError(f"the server refused the request: {text}")


def sampling_values(max_tokens: int, temperature: float | None, top_k: int | None,
                    top_p: float | None) -> dict[str, Any]:
    """Role values for a request; a temperature alone samples from the whole distribution (top-p 1)."""
    values: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature, "top_k": top_k, "top_p": top_p}
    if temperature is not None and temperature > 0 and top_k is None and top_p is None:
        values["top_p"] = 1.0
    return values


def generate_text(url: str, model: str, prompt: str, *, max_tokens: int = EXAMPLE_TOKENS,
                  temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
                  stream: bool = False, on_text: Callable[[str], None] | None = None, echo_prompt: bool = False,
                  timeout_s: float = 600.0) -> str:
    """Generate once through ``model``'s text interface at the gRPC ``url``; return the text.

    The result is the generated text; with ``echo_prompt`` a decoder model's result starts with
    the prompt it continues (an encoder-decoder's answer never does). With ``stream``, ``on_text``
    gets each new piece of text as responses arrive — for decoder models the prompt first — and
    the result is everything it got. A decoupled (streaming) model is always read as a stream.
    """
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    target = _grpc_target(url)
    client = grpcclient.InferenceServerClient(target)
    try:
        try:
            iface = text_interface(client, model)
        except InferenceServerException as exc:
            raise _client_error(exc, target, model) from None
        values = {"prompt": prompt, **sampling_values(max_tokens, temperature, top_k, top_p)}
        if iface.decoupled:
            values["stream"] = True
        inputs = iface.tensors(values, grpcclient)
        outputs = [grpcclient.InferRequestedOutput(iface.output)]
        if stream or iface.decoupled:
            text = _stream(client, iface, inputs, outputs, on_text if stream else None, timeout_s, target, prompt)
            if stream or echo_prompt or not iface.continues_prompt:
                return text
            return text.removeprefix(prompt)
        try:
            result = client.infer(model, inputs, outputs=outputs, client_timeout=timeout_s)
        except InferenceServerException as exc:
            raise _client_error(exc, target, model) from None
        text = _first_text(result.as_numpy(iface.output))
        if echo_prompt and iface.continues_prompt and not text.startswith(prompt):
            text = prompt + text
        return text
    finally:
        client.close()


def _stream(client: Any, iface: TextInterface, inputs: list[Any], outputs: list[Any],
            on_text: Callable[[str], None] | None, timeout_s: float, target: str, prompt: str) -> str:
    """Print pieces as they arrive; the text starts with the prompt whether or not the model repeats it
    (ftx's streaming ensemble sends each new piece once, one without stream offsets the whole text so far)."""
    from tritonclient.utils import InferenceServerException

    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    printed = ""
    try:
        client.async_stream_infer(iface.model, inputs, outputs=outputs, enable_empty_final_response=True)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                result, error = responses.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise ServeError(f"no response from {target} within {timeout_s:g} s") from None
            if error is not None:
                raise _client_error(error if isinstance(error, Exception) else InferenceServerException(str(error)),
                                    target, iface.model)
            text = _first_text(result.as_numpy(iface.output))
            if not printed and iface.continues_prompt and (iface.streams_pieces or not text.startswith(prompt)):
                text = prompt + text
            piece = text if iface.streams_pieces and printed else text.removeprefix(printed)
            if piece:
                printed += piece
                if on_text:
                    on_text(piece)
            final = result.get_response().parameters.get("triton_final_response")
            if final is None or final.bool_param:
                return printed
    finally:
        client.stop_stream()


# --------------------------------------------------------------------------- ftx generate


def _home() -> Path:
    from ftx.paths import ftx_home

    return ftx_home()


def resolve_target(model: str, url: str | None) -> tuple[str, str]:
    """(gRPC url, Triton model) for ``ftx generate``: ``--url``, or a detached server from ``ftx ps``.

    MODEL is the Triton model to call (``ensemble``) or the name of a detached server (its
    ensemble is called then).
    """
    if url:
        return url, model
    from ftx.triton.server import list_servers

    live = [r for r in list_servers(_home()) if r.alive]
    named = [r for r in live if r.name == model]
    if named:
        record = named[0]
        return record.grpc_url, "ensemble" if "ensemble" in record.models or not record.models else record.models[0]
    if len(live) == 1:
        return live[0].grpc_url, model
    if not live:
        raise ServeError("no running ftx server found",
                         hint="start one with `ftx run MODEL --detach`, or pass --url HOST:GRPC_PORT")
    names = ", ".join(r.name for r in live)
    raise ServeError(f"{len(live)} servers are running ({names}); which one?",
                     hint="name one as MODEL, or pass --url HOST:GRPC_PORT")


@click.command(cls=FtxCommand)
@click.argument("model")
@click.argument("prompt")
@click.option("--max-tokens", type=click.IntRange(1, 1 << 20), default=EXAMPLE_TOKENS, show_default=True,
              help="Tokens to generate.")
@click.option("--temperature", type=click.FloatRange(0, min_open=False),
              help="Sampling temperature (alone it samples from the whole distribution; 0 = greedy).")
@click.option("--top-k", type=click.IntRange(0), help="Sample from the k most likely tokens (0 = off).")
@click.option("--top-p", type=click.FloatRange(0, 1), help="Nucleus sampling probability mass (0 = off).")
@click.option("--stream", is_flag=True, help="Print tokens as they are generated (gRPC streaming).")
@click.option("--url", help="gRPC address HOST:PORT of the server (default: the detached server, see `ftx ps`).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(0, min_open=True), default=600.0, show_default=True,
              help="Seconds to wait for the answer.")
def generate(model: str, prompt: str, max_tokens: int, temperature: float | None, top_k: int | None,
             top_p: float | None, stream: bool, url: str | None, timeout_s: float) -> None:
    """Generate a continuation of PROMPT with MODEL on a running server.

    MODEL is the served model to call (normally `ensemble`) or the name of a detached server
    from `ftx ps`. Without --temperature/--top-k/--top-p decoding is greedy.
    """
    if not prompt.strip():
        raise click.BadParameter("the prompt is empty", param_hint="PROMPT")
    target, triton_model = resolve_target(model, url)
    if temperature == 0:
        temperature = None  # greedy
    text = generate_text(target, triton_model, prompt, max_tokens=max_tokens, temperature=temperature, top_k=top_k,
                         top_p=top_p, stream=stream, on_text=_writer() if stream else None, echo_prompt=True,
                         timeout_s=timeout_s)
    click.echo("" if stream else text)


def _writer() -> Callable[[str], None]:
    def write(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    return write


commands = [generate]


# --------------------------------------------------------------------------- after ftx run


def _curl(http_url: str, model: str, stream: bool) -> str:
    body = json.dumps({"text_input": EXAMPLE_PROMPT, "max_tokens": EXAMPLE_TOKENS})
    route = "generate_stream" if stream else "generate"
    return f"curl -s http://{http_url}/v2/models/{model}/{route} -d {shlex.quote(body)}"


def _decoupled(repository: Path | None) -> bool:
    if repository is None:
        return False
    from ftx.errors import ConfigError
    from ftx.triton.model_config import FT_MODEL_NAME, parse_config

    try:
        return parse_config(Path(repository) / FT_MODEL_NAME / "config.pbtxt").model_transaction_policy.decoupled
    except (ConfigError, OSError):
        return False


def describe_endpoint(result: Any, settings: Any, *, detached_name: str | None = None) -> str:
    """The block ``ftx run`` prints: URLs, models, an example curl and an example ``ftx generate``."""
    endpoint = result.endpoint
    server = endpoint.handle
    repository = result.repository.path if result.repository else None
    stream = _decoupled(repository)
    models = ", ".join(sorted(p.name for p in Path(repository).iterdir() if p.is_dir())) if repository else endpoint.model
    runtime = result.runtime.name if result.runtime else (result.repository.runtime if result.repository else "")
    metrics = getattr(server, "metrics_url", None)
    bound = settings.serve.host or endpoint.http_url.rsplit(":", 1)[0]
    lines = [
        f"serving {settings.model} ({runtime} runtime) on {bound}",
        f"  HTTP     http://{endpoint.http_url}",
        f"  gRPC     {endpoint.grpc_url}",
    ]
    if metrics:
        lines.append(f"  metrics  {metrics}")
    lines.append(f"  models   {models}")
    if getattr(server, "log_path", None):
        lines.append(f"  log      {server.log_path}")
    lines += ["", "try it:", f"  {_curl(endpoint.http_url, endpoint.model, stream)}"]
    where = "" if detached_name is not None and _is_local_server(server) else f"--url {endpoint.grpc_url}"
    stream_flag = " --stream" if stream else ""
    example = f"ftx generate {endpoint.model} {shlex.quote(EXAMPLE_PROMPT)} --max-tokens {EXAMPLE_TOKENS}{stream_flag}"
    lines.append(f"  {example} {where}".rstrip())
    return "\n".join(lines)


class _Terminate(Exception):
    """SIGTERM arrived while serving in the foreground."""


def _serve_until_stopped(server: Any) -> None:
    """Block until Ctrl-C or SIGTERM (then stop the server cleanly) or until the server dies."""

    def on_term(signum: int, frame: Any) -> None:
        raise _Terminate()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        while True:
            try:
                code = server.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                continue
            report = server.exit_report() if hasattr(server, "exit_report") else f"the server exited with code {code}"
            raise ServeError(report, hint=f"see the full log: {server.log_path}")
    except (KeyboardInterrupt, _Terminate):
        say("stopping tritonserver …")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the clean stop short
        try:
            server.stop()
        finally:
            signal.signal(signal.SIGTERM, previous)
    say("stopped")


def after_serve(result: Any, settings: Any, *, prompt: str | None = None, max_tokens: int = EXAMPLE_TOKENS) -> None:
    """What ``ftx run`` does once the server is ready.

    ``--prompt``: generate once, print the text, stop the server (unless ``--detach``).
    ``--detach``: leave the server running and say how to reach and stop it.
    Otherwise: serve in the foreground until Ctrl-C or SIGTERM, then stop cleanly.
    """
    endpoint = result.endpoint
    server = endpoint.handle
    detach = settings.serve.detach
    try:
        if prompt is not None:
            say(describe_endpoint(result, settings))
            stream = _decoupled(result.repository.path if result.repository else None)
            text = generate_text(endpoint.grpc_url, endpoint.model, prompt,
                                 max_tokens=max_tokens,
                                 stream=stream, on_text=_writer() if stream else None, echo_prompt=True)
            click.echo("" if stream else text)
            if not detach:
                _stop(result)
                return
        if detach:
            name = _detach(server)
            click.echo(describe_endpoint(result, settings, detached_name=name))
            stop_hint = getattr(server, "stop_hint", None) or f"`ftx ps` lists it, `ftx stop {name}` stops it"
            click.echo(f"\nleft running as {name!r}: {stop_hint}")
            return
        click.echo(describe_endpoint(result, settings))
        click.echo("\nCtrl-C stops the server.")
        sys.stdout.flush()
        _serve_until_stopped(server)
    except BaseException:
        if server is not None and not detach:
            _stop(result)
        raise


def _stop(result: Any) -> None:
    """Stop what the runtime started (through the runtime, which knows how)."""
    if result.runtime is not None:
        result.runtime.stop(result.endpoint)
    else:
        result.endpoint.handle.stop()


def _detach(server: Any) -> str:
    server.detach()
    return str(server.name)


def _is_local_server(server: Any) -> bool:
    """A tritonserver process ftx supervises (python runtime), as opposed to a container."""
    from ftx.triton.server import TritonServer

    return isinstance(server, TritonServer)
