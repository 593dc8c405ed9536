"""After ``ftx run`` serves: print how to reach the server, then generate once, detach or serve until stopped.

Also ``ftx generate [MODEL] PROMPT``: one request through the ensemble's text interface
(``text_input``, ``max_tokens`` … → ``text_output``) of a running server, over HTTP (the address
``ftx run`` prints) or gRPC, printing tokens as they stream when ``--stream`` is given.
"""

from __future__ import annotations

import json
import queue
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from ftx_triton.cli.common import FtxCommand, say
from ftx_triton.errors import ServeError
from ftx_triton.repository.io import TEXT_MODEL_NAME
from ftx_triton.server.text_client import TextInterface, first_text, pieces, sampling_values, text_interface

EXAMPLE_PROMPT = "Once upon a time"
EXAMPLE_TOKENS = 16

def _client_error(exc: Exception, url: str, model: str) -> ServeError:
    text = str(exc).strip() or type(exc).__name__
    if "failed to connect" in text.lower() or "unavailable" in text.lower() or "connection" in text.lower():
        return ServeError(f"cannot reach a Triton gRPC endpoint at {url}: {text}",
                          hint="start a server (`ftx run MODEL --detach`), check `ftx ps`, and pass the gRPC "
                               "address with --url HOST:PORT")
    if "unknown model" in text.lower() or "not found" in text.lower():
        return ServeError(f"the server at {url} has no model {model!r}: {text}",
                          hint=f"the text model is {TEXT_MODEL_NAME!r}")
    return ServeError(f"the server refused the request: {text}")


def generate_text(url: str, model: str, prompt: str, *, max_tokens: int = EXAMPLE_TOKENS,
                  temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
                  stream: bool = False, on_text: Callable[[str], None] | None = None, echo_prompt: bool = False,
                  timeout_s: float = 600.0, on_note: Callable[[str], None] | None = None) -> str:
    """Generate once through ``model``'s text interface at ``url``; return the text.

    ``url`` is Triton's HTTP address (``http://host:port``, as ``ftx run`` prints it: the generate
    extension) or its gRPC address (``host:port`` or ``grpc://host:port``). The result is the
    generated text; with ``echo_prompt`` a decoder model's result starts with the prompt it continues
    (an encoder-decoder's answer never does). With ``stream``, ``on_text`` gets each new piece of text
    as responses arrive — for decoder models the prompt first — and the result is everything it got.
    A decoupled (streaming) model is always read as a stream; ``stream`` against a model deployed
    without ``--streaming`` still works, and ``on_note`` is told that the text arrives whole.
    """
    values = {"prompt": prompt, **sampling_values(max_tokens, temperature, top_k, top_p)}
    if url.startswith(("http://", "https://")):
        return _generate_http(url, model, prompt, values, stream=stream, on_text=on_text, echo_prompt=echo_prompt,
                              timeout_s=timeout_s, on_note=on_note)
    return _generate_grpc(url, model, prompt, values, stream=stream, on_text=on_text, echo_prompt=echo_prompt,
                          timeout_s=timeout_s, on_note=on_note)


def _not_streaming_note(model: str) -> str:
    return (f"model {model!r} was deployed without --streaming, so the text arrives whole "
            "(deploy with `ftx run MODEL --streaming` to get it token by token)")


def _finish(text: str, prompt: str, iface: TextInterface, echo_prompt: bool) -> str:
    if echo_prompt and iface.continues_prompt and not text.startswith(prompt):
        return prompt + text
    return text


def _generate_http(url: str, model: str, prompt: str, values: dict[str, Any], *, stream: bool,
                   on_text: Callable[[str], None] | None, echo_prompt: bool, timeout_s: float,
                   on_note: Callable[[str], None] | None) -> str:
    from ftx_triton.server.text_client import HttpError, HttpTriton

    server = HttpTriton(url, timeout_s=timeout_s)
    try:
        iface = text_interface(server, model)
        if stream and not iface.decoupled and on_note:
            on_note(_not_streaming_note(model))
        if iface.decoupled:
            values["stream"] = True
        if stream or iface.decoupled:
            text = ""
            for piece in pieces(server.generate_stream(iface, values), iface, prompt):
                text += piece
                if stream and on_text:
                    on_text(piece)
            if stream or echo_prompt or not iface.continues_prompt:
                return text
            return text.removeprefix(prompt)
        return _finish(server.generate(iface, values), prompt, iface, echo_prompt)
    except HttpError as exc:
        if exc.status == 404 or "unknown model" in exc.message.lower():
            raise ServeError(f"the server at {server.base} has no model {model!r}: {exc.message}",
                             hint=f"the text model is {TEXT_MODEL_NAME!r}") from None
        raise ServeError(f"the server refused the request: {exc.message}") from None


def _generate_grpc(url: str, model: str, prompt: str, values: dict[str, Any], *, stream: bool,
                   on_text: Callable[[str], None] | None, echo_prompt: bool, timeout_s: float,
                   on_note: Callable[[str], None] | None) -> str:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    target = url.removeprefix("grpc://")
    client = grpcclient.InferenceServerClient(target)
    try:
        try:
            iface = text_interface(client, model)
        except InferenceServerException as exc:
            raise _client_error(exc, target, model) from None
        if stream and not iface.decoupled and on_note:
            on_note(_not_streaming_note(model))
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
        return _finish(first_text(result.as_numpy(iface.output)), prompt, iface, echo_prompt)
    finally:
        client.close()


def _stream(client: Any, iface: TextInterface, inputs: list[Any], outputs: list[Any],
            on_text: Callable[[str], None] | None, timeout_s: float, target: str, prompt: str) -> str:
    """Print pieces as they arrive; the text starts with the prompt whether or not the model repeats it
    (ftx's streaming ensemble sends each new piece once, one without stream offsets the whole text so far)."""
    from tritonclient.utils import InferenceServerException

    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))

    def texts() -> Iterator[str]:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                result, error = responses.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise ServeError(f"no response from {target} within {timeout_s:g} s") from None
            if error is not None:
                raise _client_error(error if isinstance(error, Exception) else InferenceServerException(str(error)),
                                    target, iface.model)
            yield first_text(result.as_numpy(iface.output))
            final = result.get_response().parameters.get("triton_final_response")
            if final is None or final.bool_param:
                return

    printed = ""
    try:
        client.async_stream_infer(iface.model, inputs, outputs=outputs, enable_empty_final_response=True)
        for piece in pieces(texts(), iface, prompt):
            printed += piece
            if on_text:
                on_text(piece)
        return printed
    finally:
        client.stop_stream()


# --------------------------------------------------------------------------- ftx generate


def _home() -> Path:
    from ftx_triton.paths import ftx_home

    return ftx_home()


def resolve_target(model: str | None, url: str | None) -> tuple[str, str]:
    """(server address, Triton model) for ``ftx generate``: ``--url``, or a detached server from ``ftx ps``.

    MODEL is the Triton model to call (``text``) or the name of a detached server (its text model
    is called then); omitted, it is the served text model (of the only running server).
    """
    if url:
        return _checked_url(url), model or TEXT_MODEL_NAME
    from ftx_triton.server.records import list_servers

    live = [r for r in list_servers(_home()) if r.alive]
    named = [r for r in live if model is not None and r.name == model]
    if named:
        record = named[0]
        return record.grpc_url, TEXT_MODEL_NAME if TEXT_MODEL_NAME in record.models or not record.models else record.models[0]
    if len(live) == 1:
        record = live[0]
        served = TEXT_MODEL_NAME if TEXT_MODEL_NAME in record.models or not record.models else record.models[0]
        return record.grpc_url, model or served
    if not live:
        raise ServeError("no running ftx server found",
                         hint="start one with `ftx run MODEL --detach`, or pass the address `ftx run` printed "
                              "(--url http://HOST:PORT)")
    names = ", ".join(r.name for r in live)
    raise ServeError(f"{len(live)} servers are running ({names}); which one?",
                     hint="name one as MODEL, or pass --url http://HOST:PORT")


def _checked_url(url: str) -> str:
    """``url`` when it names a host (and a port in range); a usage error naming it otherwise."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url if "://" in url else f"grpc://{url}")
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
        if not parts.hostname:
            raise ValueError("no host")
    except ValueError as exc:
        raise click.BadParameter(f"{url!r} is not a server address ({exc})",
                                 param_hint="--url (http://HOST:PORT or HOST:PORT, as `ftx run` prints it)") from None
    return url


@click.command(cls=FtxCommand)
@click.argument("args", nargs=-1, required=True, metavar="[MODEL] PROMPT")
@click.option("--max-tokens", type=click.IntRange(1, 1 << 20), default=EXAMPLE_TOKENS, show_default=True,
              help="Tokens to generate.")
@click.option("--temperature", type=click.FloatRange(0, min_open=False),
              help="Sampling temperature (alone it samples from the whole distribution; 0 = greedy).")
@click.option("--top-k", type=click.IntRange(0), help="Sample from the k most likely tokens (0 = off).")
@click.option("--top-p", type=click.FloatRange(0, 1), help="Nucleus sampling probability mass (0 = off).")
@click.option("--stream", is_flag=True, help="Print tokens as they are generated (a model served with --streaming).")
@click.option("--url", help="The server: the HTTP address `ftx run` prints (http://HOST:PORT) or a gRPC HOST:PORT "
                            "(default: the detached server, see `ftx ps`).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(0, min_open=True), default=600.0, show_default=True,
              help="Seconds to wait for the answer.")
def generate(args: tuple[str, ...], max_tokens: int, temperature: float | None, top_k: int | None,
             top_p: float | None, stream: bool, url: str | None, timeout_s: float) -> None:
    """Generate a continuation of PROMPT on a running server.

    MODEL is the served model to call or the name of a detached server from `ftx ps`; omitted, it
    is the served ensemble. Without --temperature/--top-k/--top-p decoding is greedy.
    """
    if len(args) > 2:
        raise click.UsageError(f"expected [MODEL] PROMPT, got {len(args)} arguments (quote a prompt with spaces)")
    model, prompt = (None, args[0]) if len(args) == 1 else args
    if not prompt.strip():
        raise click.BadParameter("the prompt is empty", param_hint="PROMPT")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:  # bytes the terminal's encoding could not decode reach Python as surrogates
        raise click.BadParameter("the prompt is not valid UTF-8 text", param_hint="PROMPT") from None
    target, triton_model = resolve_target(model, url)
    if temperature == 0:
        temperature = None  # greedy
    text = generate_text(target, triton_model, prompt, max_tokens=max_tokens, temperature=temperature, top_k=top_k,
                         top_p=top_p, stream=stream, on_text=_writer() if stream else None, echo_prompt=True,
                         timeout_s=timeout_s, on_note=lambda note: say(f"note: {note}"))
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
    from ftx_triton.errors import ConfigError
    from ftx_triton.repository.model_config import FT_MODEL_NAME, parse_config

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
    openai = getattr(result, "openai", None)
    if openai is not None:
        lines.append(f"  OpenAI   {openai.url}  (model {openai_model_id(settings.model)!r})")
    lines.append(f"  models   {models}")
    if getattr(server, "log_path", None):
        lines.append(f"  log      {server.log_path}")
    lines += ["", "try it:", f"  {_curl(endpoint.http_url, endpoint.model, stream)}"]
    where = "" if detached_name is not None and _is_local_server(server) else f"--url http://{endpoint.http_url}"
    stream_flag = " --stream" if stream else ""
    example = f"ftx generate {shlex.quote(EXAMPLE_PROMPT)} --max-tokens {EXAMPLE_TOKENS}{stream_flag}"
    lines.append(f"  {example} {where}".rstrip())
    if openai is not None:
        body = json.dumps({"model": openai_model_id(settings.model),
                           "messages": [{"role": "user", "content": EXAMPLE_PROMPT}], "max_tokens": EXAMPLE_TOKENS})
        lines.append(f"  curl -s {openai.url}/chat/completions -H 'Content-Type: application/json' "
                     f"-d {shlex.quote(body)}")
    return "\n".join(lines)


def openai_model_id(model: str) -> str:
    """The model name OpenAI clients send: what the user ran, without a scheme or revision."""
    return model.removeprefix("hf://").split("@", 1)[0].rstrip("/") or model


def _start_openai(result: Any, settings: Any, detach: bool) -> Any:
    """The OpenAI-compatible endpoint for this deployment (None with --no-openai or no repository)."""
    if not settings.serve.openai or result.repository is None:
        return None
    from ftx_triton.openai_api.launch import start_openai

    s = settings.serve
    return start_openai(f"http://{result.endpoint.http_url}", result.repository.path, openai_model_id(settings.model),
                        home=_home(), host=s.openai_host, port=s.openai_port, detach=detach)


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
    result.openai = None
    left_running = False  # once detached and recorded, `ftx ps`/`ftx stop` own the server
    try:
        if prompt is None or detach:
            result.openai = _start_openai(result, settings, detach)
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
            if result.openai is not None:
                from ftx_triton.openai_api.records import write_record

                write_record(_home(), {"name": name, "pid": result.openai.process.pid, "url": result.openai.url,
                                       "triton_pid": getattr(server, "pid", None), "log": str(result.openai.log_path)})
            left_running = True
            click.echo(describe_endpoint(result, settings, detached_name=name))
            stop_hint = getattr(server, "stop_hint", None) or f"`ftx ps` lists it, `ftx stop {name}` stops it"
            click.echo(f"\nleft running as {name!r}: {stop_hint}")
            return
        click.echo(describe_endpoint(result, settings))
        click.echo("\nCtrl-C stops the server.")
        sys.stdout.flush()
        _serve_until_stopped(server)
        if result.openai is not None:
            result.openai.stop()
    except BaseException:
        if not left_running:  # a detached run that failed before it was recorded leaves nothing behind
            if server is not None:
                _stop(result)
            elif result.openai is not None:
                result.openai.stop()
        raise


def _stop(result: Any) -> None:
    """Stop what the runtime started (through the runtime, which knows how), and the OpenAI endpoint."""
    if getattr(result, "openai", None) is not None:
        result.openai.stop()
    if result.runtime is not None:
        result.runtime.stop(result.endpoint)
    else:
        result.endpoint.handle.stop()


def _detach(server: Any) -> str:
    server.detach()
    return str(server.name)


def _is_local_server(server: Any) -> bool:
    """A tritonserver process ftx supervises (python runtime), as opposed to a container."""
    from ftx_triton.server.tritonserver import TritonServer

    return isinstance(server, TritonServer)
