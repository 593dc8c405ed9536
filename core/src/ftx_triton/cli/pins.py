"""``ftx lock``: pin the plugins a deployment uses, its model source by content and every setting as asked into
ftx.toml."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from ftx_triton.cli.common import FtxCommand, get_host, say
from ftx_triton.cli.manifest import MANIFEST_NAME, current_stack, locked_settings, write_lock
from ftx_triton.cli.options import deployment_conversion_options, repository_options, source_options, tune_options
from ftx_triton.commandkit import options_of
from ftx_triton.errors import ConfigError
from ftx_triton.plan.settings import RunSettings, RunWideSettings, ServeSettings


def _requires(family: str | None, runtime: str) -> list[str]:
    """Exact pins of what the deployment uses: core, the family's plugin and a plugin's runtime named with
    --runtime. A family not known before download (an hf:// source without --family) pins every loaded plugin."""
    from ftx_triton.plugins import CORE_DISTRIBUTION, installed_distributions

    host = get_host()
    used = {CORE_DISTRIBUTION}
    if family is None:
        used |= {r.distribution for r in host.records if r.status == "loaded"}
    elif owner := host.family_owner.get(family):
        used.add(owner)
    if runtime_owner := host.runtime_owner.get(runtime):
        used.add(runtime_owner)
    return [f"{name}=={version}" for name, version in installed_distributions() if name in used]


def _family_of(table: dict[str, Any], source: Path | None) -> str | None:
    """The family the lock is for: given, the preset's, or detected from a local directory's config.json."""
    if table.get("family"):
        return str(table["family"])
    if source is not None and source.is_dir():
        return get_host().family_for_source(source, None)[0].name
    return None


def _model_table(settings: RunSettings, family: str | None, output: Path) -> tuple[dict[str, Any], str]:
    """[model]: the source as a user would type it, pinned (commit, sha256 or content hash); a local
    directory relative to the lock file, which is meant to be committed beside it."""
    from ftx_triton.cli.run import run_pipeline
    from ftx_triton.engine.sources import preset_refs, resolve_source
    from ftx_triton.fetching.refs import resolve_revision
    from ftx_triton.plan.settings import path_fingerprint

    host = get_host()
    ref, preset_family = resolve_source(settings, host)
    table: dict[str, Any] = {"family": family or preset_family, "preset": ref.preset}
    builtin = ref.preset is not None and preset_refs(host)[ref.preset].kind == "builtin"
    if builtin:  # built on this machine from ftx itself: the name is the pin, never the build's path
        table["source"] = ref.preset
        return table, f"{ref.preset} (built in)"
    table["source"] = settings.fetch.source or settings.model if ref.preset else ref.uri
    if ref.kind == "hf":
        table["revision"] = resolve_revision(ref)
        return table, f"{ref.display} -> {table['revision']}"
    if ref.kind == "url":
        _check_lockable(str(table["source"]))
        sha = ref.sha256
        if not sha:
            say(f"downloading {ref.display} to pin its sha256 …")
            fetched = run_pipeline(settings.replace(until="fetch"))
            sha = (fetched.source.origin if fetched.source else {}).get("sha256")
        table["sha256"] = sha
        return table, f"{ref.display} -> sha256 {sha}"
    path = Path(ref.uri)
    say(f"hashing {path} to pin its content …")
    table["source"] = os.path.relpath(path.resolve(), output.parent.resolve())
    table["fingerprint"] = resolve_revision(ref)
    table["tree_sha256"] = path_fingerprint(path).get("tree") if path.is_dir() else path_fingerprint(path)["sha256"]
    return table, f"{path} -> content {table['tree_sha256'][:16]}…"


def _adapter_table(settings: RunSettings, output: Path) -> dict[str, str]:
    """[model] adapter, pinned as the source is: a Hub adapter by its commit, a folder (relative to the lock
    file) by its content key."""
    from ftx_triton.conversion.adapters import check_adapter_folder
    from ftx_triton.fetching.local_keys import local_content_key
    from ftx_triton.fetching.refs import parse_ref, resolve_revision
    from ftx_triton.paths import ftx_home

    if not settings.fetch.adapter:
        return {}
    ref = parse_ref(settings.fetch.adapter)
    if ref.kind == "hf":
        return {"adapter": ref.uri, "adapter_revision": resolve_revision(ref)}
    folder = Path(ref.uri)
    check_adapter_folder(folder)
    return {
        "adapter": os.path.relpath(folder.resolve(), output.parent.resolve()),
        "adapter_revision": local_content_key(folder, ftx_home()).key,
    }


def _check_lockable(url: str) -> None:
    """ftx.toml is meant to be committed: a URL with credentials (a presigned query, user:password@) is refused,
    as a redacted one could not be fetched again."""
    from ftx_triton.errors import SourceError
    from ftx_triton.terminal.redact import redact_url

    if (redacted := redact_url(url)) != url:
        raise SourceError(
            f"{redacted} carries credentials (a query string or user-info), which ftx.toml, "
            "a file meant to be committed, must not hold",
            hint="lock a URL without them (one your machines can fetch as it is), or pass the "
            "signed URL at run time: `ftx run URL`",
        )


@click.command(cls=FtxCommand)
@click.argument("model")
@source_options
@deployment_conversion_options
@repository_options
@options_of(
    RunWideSettings,
    only=("runtime",),
    helps={"runtime": "Runtime to pin (auto: the one `ftx run` chooses on the machine that replays the lock)."},
)
@tune_options
@options_of(ServeSettings, only=("host", "http_port", "grpc_port", "metrics_port", "device"))
@click.option(
    "--output",
    "-o",
    default=MANIFEST_NAME,
    show_default=True,
    help=f"The deployment file to write (a directory: {MANIFEST_NAME} in it).",
)
@click.option("--force", is_flag=True, help="Replace an existing deployment file that says something else.")
@click.option(
    "--resolve",
    is_flag=True,
    help="Record the runtime, tp and weight dtype this machine chooses for `auto` (a lock for hosts like this "
    "one) instead of `auto`.",
)
def lock(model: str, output: str, force: bool, resolve: bool, **opts: Any) -> None:
    """Write ftx.toml: exact versions of core and the plugins the deployment uses, MODEL pinned, and every
    setting as asked.

    MODEL is pinned by kind: a Hugging Face revision to its commit, a URL to its sha256 (downloaded
    once), a local directory to its content hash (and written relative to the file), a built-in model to
    its name. Settings are recorded as given, not as this machine would resolve them: `--runtime auto`
    and `--weight-dtype auto` stay auto, so a lock written on a CPU machine serves on the GPU host that
    replays it, and vice versa. `ftx run` with no MODEL, beside ftx.toml (or `--lock FILE`), replays it.
    """
    from ftx_triton.runtime.select import check_runtime_name

    path = lock_path(output)
    tokenizer = opts.get("tokenizer")
    if tokenizer is not None:
        opts["tokenizer"] = Path(tokenizer).expanduser().resolve()
    settings = RunSettings.of(model, **opts)
    check_runtime_name(get_host().runtimes, settings.runtime)
    table, pinned = _model_table(settings, opts.get("family"), path)
    if adapter := _adapter_table(settings, path):
        table.update(adapter)
        pinned += f", adapter {adapter['adapter']} -> {adapter['adapter_revision']}"
    local = Path(table["source"]) if "tree_sha256" in table else None
    family = _family_of(table, (path.parent / local).resolve() if local is not None else None)
    requires = _requires(family, settings.runtime)
    locked = {
        key: os.path.relpath(Path(value).resolve(), path.parent.resolve())
        if isinstance(getattr(settings.configure, key, None), Path)
        else value
        for key, value in locked_settings(settings).items()
    }  # paths relative to the file, as the source
    if resolve:
        locked.update(_resolved(settings))
    stack = current_stack(get_host().runtimes.values())
    write_lock(path, requires, table, locked, stack=stack, replace=force)
    say(
        f"pinned {len(requires)} distributions, {pinned}, runtime {locked['runtime']}, "
        f"tp {locked.get('tp', 'auto')}, weights {locked.get('weight_dtype', 'auto')}"
    )
    click.echo(str(path))


def _resolved(settings: RunSettings) -> dict[str, Any]:
    """What this machine chooses for ``auto``: the runtime, tp and weight dtype of the plan ``ftx run`` would
    follow here (planned, nothing fetched or built)."""
    from ftx_triton.cli.common import command_store
    from ftx_triton.engine.pipeline import Pipeline

    plan = Pipeline(get_host(), command_store(), settings).plan()
    if plan.runtime is None:
        raise ConfigError(
            f"the runtime and tp for {settings.model} cannot be chosen before its config.json is here",
            hint=f"run `ftx pull {settings.model}` first (or pass --family for a preset), then lock with --resolve",
        )
    return {
        "runtime": plan.runtime.name,
        "tp": plan.settings.convert.planned_tp,
        "weight_dtype": plan.settings.convert.weight_dtype,
    }


def lock_path(output: str) -> Path:
    """The file ``-o`` names: ``ftx.toml`` inside it when it is a directory or ends with a separator (``-o dir/``
    once wrote a file named ``dir``)."""
    path = Path(output).expanduser()
    if output.endswith(("/", os.sep)) or path.is_dir():
        if not path.is_dir():
            raise ConfigError(
                f"-o {output} names a directory, which does not exist",
                hint=f"create it first, or pass the file to write (e.g. -o {path / MANIFEST_NAME})",
            )
        return path / MANIFEST_NAME
    return path


commands = [lock]
