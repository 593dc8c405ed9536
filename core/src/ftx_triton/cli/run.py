"""``ftx run``: every stage, from a model name to a served endpoint."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from ftx_triton.cli.common import PluginOptionsCommand, command_store, get_host, pop_plugin_options, say
from ftx_triton.cli.options import (
    TpType,
    deployment_conversion_options,
    repository_options,
    safety_options,
    section,
    source_options,
    stage_options,
    tune_options,
)
from ftx_triton.commandkit import options_of
from ftx_triton.errors import ConfigError
from ftx_triton.front.addresses import is_loopback
from ftx_triton.paths import ftx_home
from ftx_triton.plan.settings import AUTO, RunSettings, ServeSettings, TuneSettings

if TYPE_CHECKING:
    from ftx_triton.commandkit import CommandKit
    from ftx_triton.engine.pipeline import RunResult


def settings_from_options(model: str, **opts: Any) -> RunSettings:
    """RunSettings from click options (flat names; each lands in its stage's section)."""
    return RunSettings.of(model, **opts)


def run_pipeline(
    settings: RunSettings,
    lock: Path | None = None,
    *,
    allow_drift: bool = True,
    before_serve: Callable[[], None] | None = None,
) -> RunResult:
    """Check the deployment's pins (its stack: refused on drift unless ``allow_drift``, which only warns), then
    run the pipeline over the user's FTX_HOME (``before_serve``: called as the serve stage begins)."""
    from ftx_triton.cli.manifest import check_requirements, check_stack, find_manifest
    from ftx_triton.engine.pipeline import Pipeline
    from ftx_triton.store.housekeeping import rotate_logs

    manifest = find_manifest(lock=lock)
    if manifest is not None:
        check_requirements(manifest)
        check_stack(manifest, get_host().runtimes.values(), allow_drift=allow_drift)
    rotate_logs(ftx_home())  # server logs do not pile up: the newest ones are kept
    # a dry run's plan is its result: stdout (`ftx run … --dry-run > plan.txt`); warnings and errors stay on stderr
    pipeline = Pipeline(get_host(), command_store(), settings, say=click.echo if settings.dry_run else say)
    if before_serve is not None:
        pipeline.before_serve = before_serve
    return pipeline.run()


def command_kit() -> CommandKit:
    """The kit plugins' commands are built with (``ftx_register_commands``)."""
    from ftx_triton.cli import options
    from ftx_triton.commandkit import CommandKit

    groups = {
        "source": options.source_options,
        "conversion": options.conversion_options,
        "repository": options.repository_options,
        "tune": options.tune_options,
        "safety": options.safety_options,
    }
    return CommandKit(run=run_pipeline, settings=settings_from_options, options=groups)


def model_from_manifest(model: str | None, opts: dict[str, Any], lock: Path | None = None) -> str:
    """MODEL may be omitted when ./ftx.toml has a [model] section (as written by `ftx lock`).

    Then the locked source, its pin (revision, sha256, content hash) and every locked setting apply;
    an option given on the command line (or in its environment twin) overrides the file.
    """
    if model:
        return model
    from ftx_triton.cli.manifest import check_local_source, find_manifest, locked_adapter, locked_source

    manifest = find_manifest(lock=lock)
    if manifest is None or "source" not in manifest.model:
        raise ConfigError(
            f"no MODEL given and no {lock or './ftx.toml'} with a [model] source",
            hint="run `ftx run gptj`, or `ftx lock MODEL` to write ftx.toml first",
        )
    check_local_source(manifest)
    ctx = click.get_current_context()
    locked = {**manifest.settings, **{k: manifest.model.get(k) for k in ("revision", "family", "sha256")}}
    locked["adapter"] = locked_adapter(manifest)
    params = {p.name: p for p in ctx.command.get_params(ctx)}  # with the runtimes' and plugins'
    if unknown := sorted(k for k in manifest.settings if k not in opts):  # opts: the deployment's options
        import difflib

        if unknown[0] in _NOT_SETTINGS:
            raise ConfigError(
                f"{manifest.path}: [settings] {unknown[0]!r} is no setting of the deployment",
                hint=_NOT_SETTINGS[unknown[0]],
            )
        close = difflib.get_close_matches(unknown[0], [k for k in opts if k], n=1)
        raise ConfigError(
            f"{manifest.path}: [settings] {unknown[0]!r} is no setting of `ftx run`"
            + (f" (did you mean {close[0]!r}?)" if close else ""),
            hint="the keys are `ftx run` option names with _ for - (see `ftx run --help`); "
            "`ftx lock` writes a complete file",
        )
    for key, value in locked.items():
        if value is None or key not in ctx.params and key not in opts:
            continue
        if key in params and isinstance(params[key].type, click.Path) and isinstance(value, str):
            value = str(manifest.path.parent / value)  # paths in the file are relative to it (absolute ones stay)
        if key in params:
            value = locked_value(ctx, params[key], value, manifest.path)
        source = ctx.get_parameter_source(key)
        if source in (None, ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP):
            if (reach := _reaches_beyond(key, value)) is not None:
                option = "/".join(params[key].opts)
                raise ConfigError(
                    f"{manifest.path}: [settings] {key} = {value!r} {reach}; a file from a repository "
                    "cannot widen exposure on its own",
                    hint=f"pass {option} {value} on the command line to mean it (or remove the line "
                    "to keep it on this machine)",
                )
            opts[key] = tuple(value) if isinstance(value, list) else value
            if key == "runtime":
                opts["runtime_origin"] = manifest.path.name
    return locked_source(manifest)


_NOT_SETTINGS = {
    "model": 'the model goes in [model] as source = "…" (or give MODEL on the command line)',
    "prompt": "ftx.toml describes the deployment, not one request: pass --prompt on the command line",
    "max_tokens": "ftx.toml describes the deployment, not one request: pass --max-tokens on the command line",
}
"""``ftx run`` parameters that are no deployment setting, and where they go instead."""
_EXPOSING = ("host", "openai_host")
"""Settings whose non-loopback value opens endpoints to the network: only the command line may do that."""


def _reaches_beyond(key: str, value: object) -> str | None:
    """Why a setting from a file would reach beyond this machine (only the command line may), or None."""
    text = str(value)
    if key in _EXPOSING and not is_loopback(text):
        return "would expose the server beyond this machine"
    if key == "hosts":
        return "would start server processes, holding the model and every request, on the machines it lists"
    if key == "docker_host":
        from urllib.parse import urlsplit

        parts = urlsplit(text)
        if parts.scheme not in ("unix", "npipe", "") and not is_loopback(parts.hostname or ""):
            return "would hand the model and its server to the Docker daemon of another machine"
    return None


_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _check_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--name``: what fits in a file name and a terminal (it names the server's log and record files)."""
    if value is not None and not _NAME_RE.fullmatch(value):
        raise click.BadParameter(
            f"{value[:80]!r} is not a name: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return value


def _refuse_taken_name(name: str) -> None:
    """Refuse ``--name`` when a running server has it, before anything is fetched, built or started."""
    from ftx_triton.server.records import list_servers

    if any(record.alive and record.name == name for record in list_servers(ftx_home())):
        raise ConfigError(
            f"a server named {name!r} is already running", hint=f"stop it (`ftx stop {name}`), or choose another --name"
        )


def locked_value(ctx: click.Context, param: click.Parameter, value: Any, path: Path) -> Any:
    """A [settings] value checked as its command-line option checks it (TOML type, then the option's own
    type: range, choices), so the file and the command line never disagree; a wrong one is a ConfigError."""
    if param.name == "env" and isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
        return value  # KEY = "VALUE" pairs, as `ftx lock` writes a mapping
    if isinstance(param.type, TpType) and value == "auto":
        return AUTO  # tp = "auto", as `ftx lock` writes the default
    kind = {click.types.BoolParamType: bool, click.types.IntParamType: int, click.types.FloatParamType: float}
    want: type = next((t for cls, t in kind.items() if isinstance(param.type, cls)), str)
    items = value if isinstance(value, list) and param.multiple else [value]
    fits = (isinstance(value, list) or not param.multiple) and all(
        type(v) is want or (want is float and type(v) is int) for v in items
    )
    if fits:
        with contextlib.suppress(click.BadParameter):
            return param.type_cast_value(ctx, value)
    raise ConfigError(
        f"{path}: [settings] {param.name} must be {_expected(param)}, not {type(value).__name__} {value!r}",
        hint=f"write what {'/'.join(param.opts + param.secondary_opts)} takes on the "
        "command line, or rewrite the file with `ftx lock MODEL`",
    )


def _expected(param: click.Parameter) -> str:
    """What an option takes, in words: "an integer in 1-64", "one of auto, cpu, cuda", "true or false" …"""
    t = param.type
    if isinstance(t, click.Choice):
        what = "one of " + ", ".join(map(str, t.choices))
    elif isinstance(t, TpType):
        what = f"an integer in {t.min}-{t.max} or auto"
    elif isinstance(t, click.IntRange):
        what = f"an integer in {t.min}-{t.max}"
    elif isinstance(t, click.types.IntParamType):
        what = "an integer"
    elif isinstance(t, click.types.FloatParamType):
        what = "a number"
    elif isinstance(t, click.types.BoolParamType):
        what = "true or false"
    elif isinstance(t, click.Path):
        what = "a path that exists" if t.exists else "a path"
    else:
        what = "a string"
    return f"a list, each item {what}" if param.multiple else what


@click.command(cls=PluginOptionsCommand)
@click.argument("model", required=False)
@source_options
@deployment_conversion_options
@repository_options
@stage_options
@safety_options
@tune_options
@options_of(ServeSettings, callbacks={"name": _check_name})
@options_of(TuneSettings, only=("tune",))
@section(
    "Source",
    click.option(
        "--lock",
        "lock_file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="The deployment file to replay when MODEL is omitted (default: ./ftx.toml), as "
        "`ftx lock -o FILE` wrote it; its requirements are checked either way.",
    ),
    click.option(
        "--allow-drift",
        is_flag=True,
        help="Serve even when this machine's stack (torch, transformers, numpy, tritonserver, the image's or "
        "build's pinned sources) differs from the lock's [stack]; the difference is warned about.",
    ),
)
@section(
    "Try it",
    click.option("--prompt", help="Generate a continuation of this prompt once the server is ready, then stop."),
    click.option(
        "--max-tokens",
        type=click.IntRange(1, 4096),
        default=16,
        show_default=True,
        help="Tokens to generate for --prompt.",
    ),
)
def run(
    model: str | None, prompt: str | None, max_tokens: int, lock_file: Path | None, allow_drift: bool, **opts: Any
) -> None:
    """Fetch, convert, tune, configure and serve MODEL.

    MODEL is a preset (see `ftx models`), hf://org/name[@revision], a URL or a local path;
    omitted, it comes from ./ftx.toml or --lock FILE (see `ftx lock`).
    """
    from ftx_triton.terminal import timeline

    timeline.step("start")  # the interpreter, imports and option parsing
    model = model_from_manifest(model, opts, lock_file)
    plugin_values = pop_plugin_options(opts)
    settings = settings_from_options(model, plugin_options=plugin_values, **opts)
    if settings.serve.openai and (prompt is None or settings.serve.detach):  # the front starts after the server
        from ftx_triton.server.ports import check_host

        check_host(settings.serve.openai_host, option="--openai-host")
    if settings.serve.name and not settings.dry_run:
        _refuse_taken_name(settings.serve.name)
    one_shot = prompt is not None and not settings.serve.detach and not settings.dry_run
    quiet = one_shot and not click.get_current_context().find_root().meta.get("verbose")
    with _warm_front(settings, prompt) as warm:
        with _held_back(quiet):
            result = run_pipeline(
                settings, lock_file, allow_drift=allow_drift, before_serve=warm.start if warm is not None else None
            )
        if quiet and result.endpoint is not None:
            say(_summary(settings, result))
        if settings.dry_run:
            return
        if result.repository and result.endpoint is None:
            click.echo(str(result.repository.path))
        elif result.checkpoint and settings.until in ("convert", "tune"):
            click.echo(str(result.checkpoint.path))
        elif result.source and settings.until == "fetch":
            click.echo(str(result.source.path))
        if result.deployment is not None:
            from ftx_triton.cli.serving import after_serve

            result.deployment.warm_front = warm
            with _held_back(quiet):
                after_serve(result.deployment, prompt=prompt, max_tokens=max_tokens)


def _warm_front(settings: RunSettings, prompt: str | None) -> contextlib.AbstractContextManager[Any]:
    """The OpenAI front's process when the run will start one, started as the serve stage begins: its imports
    (about a second) overlap the model's load, and it binds its port only once it is handed the ready server's
    address."""
    if not settings.serve.openai or settings.dry_run or settings.until != "serve":
        return contextlib.nullcontext()
    if prompt is not None and not settings.serve.detach:
        return contextlib.nullcontext()
    from ftx_triton.openai_api.launch import WarmFront

    return WarmFront(detach=settings.serve.detach)


def _held_back(quiet: bool) -> contextlib.AbstractContextManager[object]:
    """A one-shot ``--prompt`` run holds its step-by-step lines back (``-v`` shows them; a failure prints them)."""
    from ftx_triton.terminal.console import held_back

    return held_back() if quiet else contextlib.nullcontext()


def _summary(settings: RunSettings, result: RunResult) -> str:
    """The one line a quiet ``--prompt`` run prints before the answer."""
    built = [o.stage for o in result.outcomes if not o.cached and not o.detail]
    cached = sum(o.cached for o in result.outcomes)
    steps = ", ".join(
        filter(None, [f"built {', '.join(built)}" if built else "", f"{cached} stages cached" if cached else ""])
    )
    runtime = result.runtime.name if result.runtime else "?"
    return f"{settings.model}: {runtime} runtime, {steps or 'ready'} (-v shows every step)"


commands = [run]
