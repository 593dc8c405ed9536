"""``ftx generate`` and what ``ftx run`` shows once it serves: a thin command layer.

``ftx generate [MODEL] PROMPT``: one request through the ensemble's text interface of a running server
(:mod:`ftx_triton.client.generate`, over HTTP or gRPC), printing tokens as they stream with ``--stream``;
``--chat`` talks to its OpenAI endpoint (:mod:`ftx_triton.client.chat`). After ``ftx run`` serves, the
lifecycle (one answer, detach, foreground) is the engine's :meth:`~ftx_triton.engine.deployment.Deployment.serve`;
this module prints what it is told.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import click

from ftx_triton.cli.common import FtxCommand, say
from ftx_triton.cli.options import FiniteFloatRange
from ftx_triton.client.generate import generate_answer
from ftx_triton.client.text_client import Answer
from ftx_triton.engine.deployment import Deployment, openai_model_id
from ftx_triton.errors import ServeError
from ftx_triton.repository.io import TEXT_MODEL_NAME

EXAMPLE_PROMPT = "Once upon a time"
EXAMPLE_TOKENS = 16
MAX_BEAM = 16
"""The widest --beam (the python runtime's limit; FasterTransformer's memory grows with it)."""
MAX_GENERATIONS = 64
"""The most --n generations one command makes."""
MAX_TIMEOUT_S = 7 * 24 * 3600.0
"""The longest --timeout (a week; sockets refuse far larger ones)."""


def repository_at(target: str) -> Path | None:
    """The repository of the server of this FTX_HOME listening at the gRPC address ``target``, if any."""
    from ftx_triton.server.processes import served_models
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
    from ftx_triton.server.processes import served_models
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
            on_text=_write if stream else None,
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
    from ftx_triton.cli.chat import find_openai, prompt_lines
    from ftx_triton.client.chat import chat

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


def _write(piece: str) -> None:
    """A streamed piece on stdout, at once."""
    sys.stdout.write(piece)
    sys.stdout.flush()


commands = [generate]


# --------------------------------------------------------------------------- after ftx run


def _curl(http_url: str, model: str, stream: bool) -> str:
    body = json.dumps({"text_input": EXAMPLE_PROMPT, "max_tokens": EXAMPLE_TOKENS})
    route = "generate_stream" if stream else "generate"
    return f"curl -s http://{http_url}/v2/models/{model}/{route} -d {shlex.quote(body)}"


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
    stream = deployment.streams
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
    """What ``ftx run`` does once the server is ready: the engine's lifecycle (:meth:`Deployment.serve`),
    shown on the terminal.

    ``--prompt``: generate once, print the text, stop the server (unless ``--detach``).
    ``--detach``: leave the server running and say how to reach and stop it.
    Otherwise: serve in the foreground until Ctrl-C or SIGTERM, then stop cleanly.
    """
    deployment.serve(_Terminal(deployment), prompt=prompt, max_tokens=max_tokens)


class _Terminal:
    """The lifecycle on the terminal (a :class:`~ftx_triton.engine.deployment.ServeView`)."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment

    def text(self, piece: str) -> None:
        _write(piece)

    def step(self, name: str) -> None:
        from ftx_triton.terminal import timeline  # structlog and rich: not on `ftx --help`'s path

        timeline.step(name)

    def answered(self, text: str, streamed: bool) -> None:
        click.echo("" if streamed else text)  # no "try it" block: the server stops after the answer

    def detached(self, name: str) -> None:
        from ftx_triton.terminal import timeline
        from ftx_triton.terminal.console import json_mode

        timeline.summary()
        if json_mode():  # a script reads where it runs, as `ftx ps --json` shows it
            click.echo(json.dumps(endpoint_json(self.deployment, name), sort_keys=True))
            return
        click.echo(describe_endpoint(self.deployment))
        stop_hint = self.deployment.server.stop_hint or f"`ftx ps` lists it, `ftx stop {name}` stops it"
        click.echo(f"\nleft running as {name!r}: {stop_hint}")

    def serving(self) -> None:
        click.echo(describe_endpoint(self.deployment))
        click.echo("\nCtrl-C stops the server.")
        sys.stdout.flush()

    def stopping(self) -> None:
        say("stopping tritonserver …")

    def stopped(self) -> None:
        say("stopped")
