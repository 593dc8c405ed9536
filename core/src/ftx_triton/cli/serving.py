"""After ``ftx run`` serves: print how to reach the server, then generate once, detach or serve until stopped.

Also ``ftx generate [MODEL] PROMPT``: one request through the ensemble's text interface
(``text_input``, ``max_tokens`` … → ``text_output``) of a running server, over HTTP (the address
``ftx run`` prints) or gRPC, printing tokens as they stream when ``--stream`` is given.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shlex
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from ftx_triton.cli.common import FtxCommand, say
from ftx_triton.cli.options import FiniteFloatRange
from ftx_triton.engine.deployment import Deployment, openai_model_id
from ftx_triton.errors import ServeError
from ftx_triton.repository.io import TEXT_MODEL_NAME
from ftx_triton.server.text_client import (
    TOKEN_IDS,
    TOKEN_LOG_PROBS,
    Answer,
    PieceJoiner,
    TextInterface,
    first_text,
    sampling_values,
    text_interface,
)

EXAMPLE_PROMPT = "Once upon a time"
EXAMPLE_TOKENS = 16
MAX_BEAM = 16
"""The widest --beam (the python runtime's limit; FasterTransformer's memory grows with it)."""
MAX_GENERATIONS = 64
"""The most --n generations one command makes."""
MAX_TIMEOUT_S = 7 * 24 * 3600.0
"""The longest --timeout (a week; sockets refuse far larger ones)."""


def _client_error(exc: Exception, url: str, model: str) -> ServeError:
    text = str(exc).strip() or type(exc).__name__
    if "failed to connect" in text.lower() or "unavailable" in text.lower() or "connection" in text.lower():
        return ServeError(
            f"cannot reach a Triton gRPC endpoint at {url}: {text}",
            hint="start a server (`ftx run MODEL --detach`), check `ftx ps`, and pass the gRPC "
            "address with --url HOST:PORT",
        )
    if "unknown model" in text.lower() or "not found" in text.lower():
        return ServeError(
            f"the server at {url} has no model {model!r}: {text}", hint=f"the text model is {TEXT_MODEL_NAME!r}"
        )
    return ServeError(f"the server refused the request: {text}")


def generate_text(url: str, model: str, prompt: str, **kwargs: Any) -> str:
    """Generate once through ``model``'s text interface at ``url``; return the text (see :func:`generate_answer`)."""
    return generate_answer(url, model, prompt, **kwargs).text


def generate_answer(
    url: str,
    model: str,
    prompt: str,
    *,
    max_tokens: int = EXAMPLE_TOKENS,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    options: Mapping[str, Any] | None = None,
    stream: bool = False,
    on_text: Callable[[str], None] | None = None,
    echo_prompt: bool = False,
    timeout_s: float = 600.0,
    on_note: Callable[[str], None] | None = None,
    repository: Path | None = None,
) -> Answer:
    """Generate once through ``model``'s text interface at ``url``; the text, with the generated token ids and
    their log probabilities where the model gives them.

    ``url`` is Triton's HTTP address (``http://host:port``, as ``ftx run`` prints it: the generate
    extension) or its gRPC address (``host:port`` or ``grpc://host:port``). The text is the generated
    text; with ``echo_prompt`` a decoder model's result starts with the prompt it continues (an
    encoder-decoder's answer never does). With ``stream``, ``on_text`` gets each new piece of text as
    responses arrive — for decoder models the prompt first — and the text is everything it got.
    ``options`` holds further roles of the text interface (``seed``, ``beam_width``, ``bad_words``).
    A decoupled (streaming) model is always read as a stream; ``stream`` against a model deployed
    without ``--streaming`` still works, and ``on_note`` is told that the text arrives whole.
    ``repository``: the served repository, when it is on this machine; a streaming one is then read over its
    token route (ids from the fastertransformer model over gRPC, text made here: :mod:`~ftx_triton.server.token_stream`).
    """
    values = {"prompt": prompt, **sampling_values(max_tokens, temperature, top_k, top_p), **(options or {})}
    routed = not (values.get("logprobs") or int(values.get("beam_width") or 1) > 1)  # the route reads ids only
    if routed and repository is not None and model == TEXT_MODEL_NAME and not url.startswith(("http://", "https://")):
        text = _generate_tokens(url, repository, prompt, values, stream, on_text, echo_prompt, timeout_s)
        if text is not None:
            return Answer(text)
    call = _generate_http if url.startswith(("http://", "https://")) else _generate_grpc
    return call(
        url,
        model,
        prompt,
        values,
        stream=stream,
        on_text=on_text,
        echo_prompt=echo_prompt,
        timeout_s=timeout_s,
        on_note=on_note,
    )


def _generate_tokens(
    url: str,
    repository: Path,
    prompt: str,
    values: dict[str, Any],
    stream: bool,
    on_text: Callable[[str], None] | None,
    echo_prompt: bool,
    timeout_s: float,
) -> str | None:
    """The text over a streaming repository's token route; None when it has none (the ensemble serves)."""
    from ftx_triton.repository.textproc import RequestError
    from ftx_triton.server.token_stream import ModelRefused, TokenRoute, stream_texts_sync

    route = TokenRoute.open(repository)
    if route is None:
        return None
    lead = prompt if route.io_kind == "decoder" else ""
    printed = lead if stream or echo_prompt else ""
    if stream and on_text and lead:
        on_text(lead)
    try:
        for piece in stream_texts_sync(url, route, values, timeout_s):
            printed += piece
            if stream and on_text:
                on_text(piece)
    except (RequestError, ModelRefused) as exc:
        raise ServeError(f"the server refused the request: {exc}") from None
    return printed


def repository_at(target: str) -> Path | None:
    """The repository of the server of this FTX_HOME listening at the gRPC address ``target``, if any."""
    from ftx_triton.cli.processes import served_models
    from ftx_triton.server.records import list_servers

    address = target.removeprefix("grpc://")
    live = [r for r in list_servers(_home()) if r.alive]
    for record in live:
        if record.grpc_url == address:
            return Path(record.repository)
    for served in served_models(_home(), live):
        if served.grpc == address:
            return Path(served.repository)
    return None


def _not_streaming_note(model: str) -> str:
    return (
        f"model {model!r} was deployed without --streaming, so the text arrives whole "
        "(deploy with `ftx run MODEL --streaming` to get it token by token)"
    )


def _finish(text: str, prompt: str, iface: TextInterface, echo_prompt: bool) -> str:
    if echo_prompt and iface.continues_prompt and not text.startswith(prompt):
        return prompt + text
    return text


def _check_beams(iface: TextInterface, values: Mapping[str, Any]) -> None:
    """Beam search on a streaming deployment is refused: its best beam changes while it streams, so
    the pieces would not join into any beam's text."""
    if iface.decoupled and int(values.get("beam_width") or 1) > 1:
        raise ServeError(
            "beam search needs a deployment that answers in one piece: this one streams (--streaming), and "
            "its best running beam changes from step to step",
            hint="deploy without --streaming to use --beam",
        )


def _streamed(
    answers: Iterator[Answer], iface: TextInterface, prompt: str, on_text: Callable[[str], None] | None, whole: bool
) -> Answer:
    """The stream's answers joined: the text (starting with the prompt for a decoder, unless ``whole`` is
    False and it is cut off), and the token ids and log probabilities when each answer holds only its own."""
    joiner = PieceJoiner(iface, prompt)
    text, ids, probs = "", list[int](), list[float]()
    for answer in answers:
        piece = joiner.add(answer.text)
        if piece:
            text += piece
            if on_text:
                on_text(piece)
        if iface.gives_tokens and answer.token_ids is not None:
            ids += answer.token_ids
            probs += answer.log_probs or [0.0] * len(answer.token_ids)
    if not whole and iface.continues_prompt:
        text = text.removeprefix(prompt)
    return Answer(text, tuple(ids) if iface.gives_tokens else None, tuple(probs) if iface.gives_tokens else None)


def _generate_http(
    url: str,
    model: str,
    prompt: str,
    values: dict[str, Any],
    *,
    stream: bool,
    on_text: Callable[[str], None] | None,
    echo_prompt: bool,
    timeout_s: float,
    on_note: Callable[[str], None] | None,
) -> Answer:
    from ftx_triton.server.text_client import HttpError, HttpTriton

    server = HttpTriton(url, timeout_s=timeout_s)
    try:
        iface = text_interface(server, model)
        _check_beams(iface, values)
        if stream and not iface.decoupled and on_note:
            on_note(_not_streaming_note(model))
        if iface.decoupled:
            values["stream"] = True
        if stream or iface.decoupled:
            return _streamed(
                server.answer_stream(iface, values),
                iface,
                prompt,
                on_text if stream else None,
                stream or echo_prompt or not iface.continues_prompt,
            )
        answer = server.answer(iface, values)
        return replace(answer, text=_finish(answer.text, prompt, iface, echo_prompt))
    except HttpError as exc:
        if exc.status == 404 or "unknown model" in exc.message.lower():
            raise ServeError(
                f"the server at {server.base} has no model {model!r}: {exc.message}",
                hint=f"the text model is {TEXT_MODEL_NAME!r}",
            ) from None
        raise ServeError(f"the server refused the request: {exc.message}") from None


def _grpc_answer(result: Any, iface: TextInterface) -> Answer:
    """An Answer from a gRPC result (the token outputs when the model gives them)."""
    event: dict[str, Any] = {iface.output: first_text(result.as_numpy(iface.output))}
    if iface.gives_tokens:
        for name in (TOKEN_IDS, TOKEN_LOG_PROBS):
            array = result.as_numpy(name)
            if array is not None:
                event[name] = array.reshape(-1).tolist()
    return Answer.of(event, iface.output)


def _generate_grpc(
    url: str,
    model: str,
    prompt: str,
    values: dict[str, Any],
    *,
    stream: bool,
    on_text: Callable[[str], None] | None,
    echo_prompt: bool,
    timeout_s: float,
    on_note: Callable[[str], None] | None,
) -> Answer:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    target = url.removeprefix("grpc://")
    client = grpcclient.InferenceServerClient(target)
    try:
        try:
            iface = text_interface(client, model)
        except InferenceServerException as exc:
            raise _client_error(exc, target, model) from None
        _check_beams(iface, values)
        if stream and not iface.decoupled and on_note:
            on_note(_not_streaming_note(model))
        if iface.decoupled:
            values["stream"] = True
        inputs = iface.tensors(values, grpcclient)
        names = [iface.output, *((TOKEN_IDS, TOKEN_LOG_PROBS) if iface.gives_tokens else ())]
        outputs = [grpcclient.InferRequestedOutput(name) for name in names]
        if stream or iface.decoupled:
            return _streamed(
                _stream(client, iface, inputs, outputs, timeout_s, target),
                iface,
                prompt,
                on_text if stream else None,
                stream or echo_prompt or not iface.continues_prompt,
            )
        try:
            result = client.infer(model, inputs, outputs=outputs, client_timeout=timeout_s)
        except InferenceServerException as exc:
            raise _client_error(exc, target, model) from None
        answer = _grpc_answer(result, iface)
        return replace(answer, text=_finish(answer.text, prompt, iface, echo_prompt))
    finally:
        client.close()


def _stream(
    client: Any, iface: TextInterface, inputs: list[Any], outputs: list[Any], timeout_s: float, target: str
) -> Iterator[Answer]:
    """The answers of a gRPC stream as they arrive (ftx's streaming ensemble sends each new piece once,
    one without stream offsets the whole text so far)."""
    from tritonclient.utils import InferenceServerException

    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer(iface.model, inputs, outputs=outputs, enable_empty_final_response=True)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                result, error = responses.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise ServeError(f"no response from {target} within {timeout_s:g} s") from None
            if error is not None:
                raise _client_error(
                    error if isinstance(error, Exception) else InferenceServerException(str(error)), target, iface.model
                )
            final = result.get_response().parameters.get("triton_final_response")
            if result.as_numpy(iface.output) is not None or final is None or not final.bool_param:
                yield _grpc_answer(result, iface)
            if final is None or final.bool_param:
                return
    finally:
        client.stop_stream()


# --------------------------------------------------------------------------- ftx generate


def _home() -> Path:
    from ftx_triton.paths import ftx_home

    return ftx_home()


def resolve_target(model: str | None, url: str | None) -> tuple[str, str]:
    """(server address, Triton model) for ``ftx generate``: ``--url``, or a server `ftx ps` lists (detached, or a
    foreground ``ftx run`` of this FTX_HOME).

    MODEL is the Triton model to call (``text``) or the name of a detached server (its text model
    is called then); omitted, it is the served text model (of the only running server).
    """
    if url:
        return _checked_url(url), model or TEXT_MODEL_NAME
    from ftx_triton.cli.clusters import running_as_served
    from ftx_triton.cli.processes import served_models
    from ftx_triton.server.records import list_servers

    live = [r for r in list_servers(_home()) if r.alive]
    servers = [
        (r.name, r.grpc_url, TEXT_MODEL_NAME if TEXT_MODEL_NAME in r.models or not r.models else r.models[0])
        for r in live
    ]
    servers += [(s.name, s.grpc, TEXT_MODEL_NAME) for s in served_models(_home(), live) if not s.extra.get("detached")]
    servers += [(s.name, s.grpc, TEXT_MODEL_NAME) for s in running_as_served(_home())]
    named = [s for s in servers if model is not None and s[0] == model]
    if named:
        return named[0][1], named[0][2]
    if len(servers) == 1:
        return servers[0][1], model or servers[0][2]
    if not servers:
        raise ServeError(
            "no running ftx server found",
            hint="start one with `ftx run MODEL` (or --detach), or pass the address `ftx run` printed "
            "(--url http://HOST:PORT)",
        )
    names = ", ".join(f"{name} at {grpc}" for name, grpc, _ in servers)
    raise ServeError(
        f"{len(servers)} servers are running ({names}); which one?",
        hint="name a detached one as MODEL, or pass --url http://HOST:PORT",
    )


def _checked_url(url: str) -> str:
    """``url`` when it names a host (and a port in range); a usage error naming it otherwise."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url if "://" in url else f"grpc://{url}")
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
        if not parts.hostname:
            raise ValueError("no host")
    except ValueError as exc:
        raise click.BadParameter(
            f"{url!r} is not a server address ({exc})",
            param_hint="--url (http://HOST:PORT or HOST:PORT, as `ftx run` prints it)",
        ) from None
    return url


@click.command(cls=FtxCommand)
@click.argument("args", nargs=-1, metavar="[MODEL] PROMPT")
@click.option(
    "--max-tokens",
    type=click.IntRange(1, 1 << 20),
    default=EXAMPLE_TOKENS,
    show_default=True,
    help="Tokens to generate.",
)
@click.option(
    "--temperature",
    type=FiniteFloatRange(0, min_open=False),
    help="Sampling temperature (alone it samples from the whole distribution; 0 = greedy).",
)
@click.option("--top-k", type=click.IntRange(0), help="Sample from the k most likely tokens (0 = off).")
@click.option("--top-p", type=FiniteFloatRange(0, 1), help="Nucleus sampling probability mass (0 = off).")
@click.option("--stream", is_flag=True, help="Print tokens as they are generated (a model served with --streaming).")
@click.option(
    "--url",
    help="The server: the HTTP address `ftx run` prints (http://HOST:PORT) or a gRPC HOST:PORT "
    "(default: the detached server, see `ftx ps`).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=FiniteFloatRange(0, MAX_TIMEOUT_S, min_open=True),
    default=600.0,
    show_default=True,
    help="Seconds to wait for the answer.",
)
@click.option(
    "--chat",
    is_flag=True,
    help="Chat: one user turn per line of stdin, answered with the model's chat "
    "template through the server's OpenAI endpoint (--url: its /v1 address).",
)
@click.option("--system", help="With --chat: a system message that opens the conversation.")
@click.option(
    "--seed",
    type=click.IntRange(0, (1 << 63) - 1),
    help="Random seed of sampling (FT's random_seed): same seed, same text.",
)
@click.option(
    "--beam",
    type=click.IntRange(1, MAX_BEAM),
    help="Beam search of this width (FT's beam_width); prints the best beam (a deployment without --streaming).",
)
@click.option(
    "--n",
    "count",
    type=click.IntRange(1, MAX_GENERATIONS),
    default=1,
    show_default=True,
    help="Generations of the prompt, each printed under a header (seeds SEED, SEED+1 … with --seed).",
)
@click.option(
    "--ban",
    "banned",
    multiple=True,
    metavar="WORD",
    help="Never generate WORD (FT's bad_words_list, tokenized by the model's tokenizer); repeatable.",
)
@click.option(
    "--logprobs",
    is_flag=True,
    help="After the text, each generated token id and its log probability (FT's output_log_probs), one per line.",
)
def generate(
    args: tuple[str, ...],
    max_tokens: int,
    temperature: float | None,
    top_k: int | None,
    top_p: float | None,
    stream: bool,
    url: str | None,
    timeout_s: float,
    chat: bool,
    system: str | None,
    seed: int | None,
    beam: int | None,
    count: int,
    banned: tuple[str, ...],
    logprobs: bool,
) -> None:
    """Generate a continuation of PROMPT on a running server, or chat with it (--chat, turns from stdin).

    MODEL is the served model to call or the name of a server from `ftx ps`; omitted, it is the
    served ensemble. Without --temperature/--top-k/--top-p decoding is greedy.
    """
    if chat:
        if seed is not None or beam or count > 1 or banned or logprobs:
            raise click.UsageError("--seed, --beam, --n, --ban and --logprobs generate from a PROMPT, not with --chat")
        _chat(args, url, max_tokens, temperature, top_k, top_p, timeout_s, system)
        return
    if not args:
        raise click.UsageError("expected [MODEL] PROMPT (or --chat, which reads turns from stdin)")
    if len(args) > 2:
        raise click.UsageError(f"expected [MODEL] PROMPT, got {len(args)} arguments (quote a prompt with spaces)")
    model, prompt = (None, args[0]) if len(args) == 1 else args
    if not prompt.strip():
        raise click.BadParameter("the prompt is empty", param_hint="PROMPT")
    for text, hint in ((prompt, "PROMPT"), *((word, "--ban") for word in banned)):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # bytes the terminal's encoding could not decode reach Python as surrogates
            raise click.BadParameter("not valid UTF-8 text", param_hint=hint) from None
    if any(not word for word in banned):
        raise click.BadParameter("an empty word cannot be banned", param_hint="--ban")
    target, triton_model = resolve_target(model, url)
    if temperature == 0:
        temperature = None  # greedy
    for index in range(count):
        options: dict[str, Any] = {"beam_width": beam, "bad_words": list(banned) or None, "logprobs": logprobs or None}
        if seed is not None:
            options["seed"] = seed + index
        if count > 1:
            click.echo(
                f"--- generation {index + 1} of {count}" + (f" (seed {seed + index})" if seed is not None else "")
            )
        answer = generate_answer(
            target,
            triton_model,
            prompt,
            max_tokens=max_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            options=options,
            stream=stream,
            on_text=_writer() if stream else None,
            echo_prompt=True,
            timeout_s=timeout_s,
            on_note=lambda note: say(f"note: {note}"),
            repository=repository_at(target) if triton_model == TEXT_MODEL_NAME else None,
        )
        click.echo("" if stream else answer.text)
        if logprobs:
            _print_logprobs(answer, target)


def _print_logprobs(answer: Answer, target: str) -> None:
    """Each generated token id and its log probability, tab-separated, after a blank line."""
    if answer.token_ids is None or answer.log_probs is None:
        raise ServeError(
            f"the text model at {target} does not answer token log probabilities (a repository written by an "
            "older ftx, or FasterTransformer streaming, which resends the whole sequence each step)",
            hint="run `ftx run MODEL` again to rebuild the repository, or deploy without --streaming",
        )
    click.echo("")
    for token, value in zip(answer.token_ids, answer.log_probs, strict=True):
        click.echo(f"{token}\t{value:.6f}")


def _chat(
    args: tuple[str, ...],
    url: str | None,
    max_tokens: int,
    temperature: float | None,
    top_k: int | None,
    top_p: float | None,
    timeout_s: float,
    system: str | None,
) -> None:
    from ftx_triton.cli.chat import chat, find_openai, prompt_lines

    if len(args) > 1:
        raise click.UsageError("--chat takes at most MODEL (the turns come from stdin)")
    sampling = {k: v for k, v in {"temperature": temperature, "top_k": top_k, "top_p": top_p}.items() if v is not None}
    chat(
        find_openai(_home(), args[0] if args else None, url),
        prompt_lines(),
        click.echo,
        system=system,
        max_tokens=max_tokens,
        sampling=sampling,
        timeout_s=timeout_s,
    )


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


def _decoupled(repository: Path) -> bool:
    from ftx_triton.errors import ConfigError
    from ftx_triton.repository.model_config import FT_MODEL_NAME, parse_config

    try:
        return parse_config(repository / FT_MODEL_NAME / "config.pbtxt").model_transaction_policy.decoupled
    except (ConfigError, OSError):
        return False


def endpoint_json(deployment: Deployment, name: str) -> dict[str, object]:
    """A detached deployment as ``ftx run --detach --log-format json`` prints it on stdout: its name, model,
    runtime and addresses in the forms ``ftx ps --json`` uses."""
    endpoint, server = deployment.endpoint, deployment.server
    return {
        "name": name,
        "model": deployment.settings.model,
        "runtime": deployment.runtime.name,
        "http": f"http://{endpoint.http_url}",
        "grpc": f"grpc://{endpoint.grpc_url}",
        "metrics": server.metrics_url,
        "openai": deployment.openai.url if deployment.openai else None,
        "log": str(server.log_path) if server.log_path else None,
        "stop": server.stop_hint or f"ftx stop {name}",
    }


def describe_endpoint(deployment: Deployment) -> str:
    """The block ``ftx run`` prints: URLs, models, an example curl and an example ``ftx generate``."""
    endpoint, server, settings = deployment.endpoint, deployment.server, deployment.settings
    repository = deployment.repository.path
    stream = _decoupled(repository)
    models = ", ".join(sorted(p.name for p in repository.iterdir() if p.is_dir()))
    bound = settings.serve.host or endpoint.http_url.rsplit(":", 1)[0]
    lines = [
        f"serving {settings.model} ({deployment.runtime.name} runtime) on {bound}",
        f"  HTTP     http://{endpoint.http_url}",
        f"  gRPC     {endpoint.grpc_url}",
    ]
    if server.metrics_url:
        lines.append(f"  metrics  {server.metrics_url}")
    openai = deployment.openai
    if openai is not None:
        lines.append(f"  OpenAI   {openai.url}  (model {openai_model_id(settings.model)!r})")
        if not stream:
            lines.append("           stream: true answers in one chunk (deploy with --streaming to stream tokens)")
    lines.append(f"  models   {models}")
    if server.log_path:
        lines.append(f"  log      {server.log_path}")
    lines += ["", "try it:", f"  {_curl(endpoint.http_url, endpoint.model, stream)}"]
    where = "" if deployment.detached_name is not None and deployment.recorded else f"--url http://{endpoint.http_url}"
    stream_flag = " --stream" if stream else ""
    example = f"ftx generate {shlex.quote(EXAMPLE_PROMPT)} --max-tokens {EXAMPLE_TOKENS}{stream_flag}"
    lines.append(f"  {example} {where}".rstrip())
    if openai is not None:
        body = json.dumps(
            {
                "model": openai_model_id(settings.model),
                "messages": [{"role": "user", "content": EXAMPLE_PROMPT}],
                "max_tokens": EXAMPLE_TOKENS,
            }
        )
        lines.append(
            f"  curl -s {openai.url}/chat/completions -H 'Content-Type: application/json' -d {shlex.quote(body)}"
        )
    return "\n".join(lines)


def after_serve(deployment: Deployment, *, prompt: str | None = None, max_tokens: int = EXAMPLE_TOKENS) -> None:
    """What ``ftx run`` does once the server is ready (the lifecycle is the engine's :class:`Deployment`).

    ``--prompt``: generate once, print the text, stop the server (unless ``--detach``).
    ``--detach``: leave the server running and say how to reach and stop it.
    Otherwise: serve in the foreground until Ctrl-C or SIGTERM, then stop cleanly.
    """
    from ftx_triton.terminal import timeline  # structlog and rich: not on `ftx --help`'s path

    endpoint = deployment.endpoint
    detach = deployment.settings.serve.detach
    try:
        if prompt is None or detach:
            deployment.start_front(detach=detach)
            timeline.step("openai front")
        if prompt is not None:  # no "try it" block: the server stops after the answer (--detach prints it)
            stream = _decoupled(deployment.repository.path)
            text = generate_text(
                endpoint.grpc_url,
                endpoint.model,
                prompt,
                max_tokens=max_tokens,
                stream=stream,
                on_text=_writer() if stream else None,
                echo_prompt=True,
                repository=deployment.repository.path,
            )
            click.echo("" if stream else text)
            if not detach:
                deployment.stop()
                return
        if detach:
            name = deployment.detach()
            timeline.step("detach")
            timeline.summary()
            from ftx_triton.terminal.console import json_mode

            if json_mode():  # a script reads where it runs, as `ftx ps --json` shows it
                click.echo(json.dumps(endpoint_json(deployment, name), sort_keys=True))
                return
            click.echo(describe_endpoint(deployment))
            stop_hint = deployment.server.stop_hint or f"`ftx ps` lists it, `ftx stop {name}` stops it"
            click.echo(f"\nleft running as {name!r}: {stop_hint}")
            return
        click.echo(describe_endpoint(deployment))
        click.echo("\nCtrl-C stops the server.")
        sys.stdout.flush()
        with _foreground_front_record(deployment):
            deployment.serve_until_stopped(on_stopping=lambda: say("stopping tritonserver …"))
        say("stopped")
    except BaseException:
        if deployment.detached_name is None:  # a detached run that failed before it was recorded leaves nothing
            deployment.stop()
        raise


@contextlib.contextmanager
def _foreground_front_record(deployment: Deployment) -> Iterator[None]:
    """While a foreground ``ftx run`` serves, its OpenAI endpoint is recorded (``foreground-<pid>``) so that
    `ftx ps` shows it; the record goes when the run ends (or with the next `ftx ps` after a crash)."""
    openai = deployment.openai
    if openai is None:
        yield
        return
    from ftx_triton.openai_api.records import FOREGROUND_PREFIX, write_record

    path = write_record(
        deployment.home,
        {
            "name": f"{FOREGROUND_PREFIX}{os.getpid()}",
            "pid": openai.process.pid,
            "url": openai.url,
            "triton_pid": deployment.server.pid,
            "log": str(openai.log_path),
        },
    )
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
