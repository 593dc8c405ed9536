"""``ftx lock``: pin the plugin versions, the resolved model source and every setting into ftx.toml."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ftx_triton.cli.common import FtxCommand, command_store, get_host, say
from ftx_triton.cli.manifest import MANIFEST_NAME, locked_settings, write_lock
from ftx_triton.cli.options import PORT, conversion_options, repository_options, section, source_options, tune_options
from ftx_triton.plan.settings import RunSettings


def _resolved_settings(settings: RunSettings) -> RunSettings:
    """The settings a run would end up with: weight dtype, runtime and compute type resolved where
    they can be without downloading (a preset's or local config.json); the rest is fixed by the pin."""
    from ftx_triton.engine.pipeline import Pipeline
    from ftx_triton.errors import FtxError
    from ftx_triton.runtime.select import choose_runtime

    pipeline = Pipeline(get_host(), command_store(), settings.replace(dry_run=True))
    try:
        pipeline.run()
    except FtxError:
        pass  # planning needs the checkpoint's config: resolved at run time from the pinned source
    resolved = pipeline.settings
    runtime = resolved.runtime
    if pipeline.ctx.runtime is not None:
        runtime = pipeline.ctx.runtime.name
    else:
        try:
            runtime = choose_runtime(get_host().runtimes, resolved)[0].name
        except FtxError:
            pass
    return resolved.replace(runtime=runtime, dry_run=False)


def _model_table(settings: RunSettings, family: str | None) -> tuple[dict[str, Any], str]:
    """[model]: the source as a user would type it, pinned (commit, sha256 or content hash)."""
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
    table["source"] = str(path.resolve())
    table["fingerprint"] = resolve_revision(ref)
    table["tree_sha256"] = path_fingerprint(path).get("tree") if path.is_dir() else path_fingerprint(path)["sha256"]
    return table, f"{path} -> content {table['tree_sha256'][:16]}…"


def _check_lockable(url: str) -> None:
    """ftx.toml is meant to be committed: a URL with credentials (a presigned query, user:password@) is refused,
    as a redacted one could not be fetched again."""
    from ftx_triton.errors import SourceError
    from ftx_triton.terminal.redact import redact_url

    if (redacted := redact_url(url)) != url:
        raise SourceError(f"{redacted} carries credentials (a query string or user-info), which ftx.toml, "
                          "a file meant to be committed, must not hold",
                          hint="lock a URL without them (one your machines can fetch as it is), or pass the "
                               "signed URL at run time: `ftx run URL`")


@click.command(cls=FtxCommand)
@click.argument("model")
@source_options
@conversion_options
@repository_options
@section("Stages and runtime",
         click.option("--runtime", default="auto", show_default=True,
                      help="Runtime to pin (auto: the one `ftx run` would choose here)."))
@tune_options
@section("Serving",
         click.option("--host", default="127.0.0.1", show_default=True, help="Address the server binds to."),
         click.option("--http-port", type=PORT, help="HTTP port."),
         click.option("--grpc-port", type=PORT, help="gRPC port."),
         click.option("--metrics-port", type=PORT, help="Metrics port."),
         click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
                      help="Python runtime device."))
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), default=Path(MANIFEST_NAME),
              show_default=True, help="The deployment file to write.")
def lock(model: str, output: Path, **opts: Any) -> None:
    """Write ftx.toml: exact versions of ftx and every plugin, MODEL pinned, and every setting.

    MODEL is pinned by kind: a Hugging Face revision to its commit, a URL to its sha256 (downloaded
    once), a local directory to its content hash, a built-in model to its name. The settings are
    resolved as `ftx run` would resolve them here (runtime, weight dtype, compute type), so
    `ftx run` with no MODEL, in the directory of ftx.toml, reproduces the deployment.
    """
    from ftx_triton.plugins import CORE_DISTRIBUTION, installed_distributions

    host = get_host()
    tokenizer = opts.get("tokenizer")
    if tokenizer is not None:
        opts["tokenizer"] = Path(tokenizer).expanduser().resolve()
    settings = RunSettings.of(model, **opts)
    table, pinned = _model_table(settings, opts.get("family"))
    resolved = _resolved_settings(settings)
    loaded = {r.distribution for r in host.records if r.status == "loaded"} | {CORE_DISTRIBUTION}
    requires = [f"{name}=={version}" for name, version in installed_distributions() if name in loaded]
    write_lock(output, requires, table, locked_settings(resolved))
    say(f"pinned {len(requires)} distributions, {pinned}, runtime {resolved.runtime}, "
        f"tp {resolved.convert.tp}, weights {resolved.convert.weight_dtype}")
    click.echo(str(output))


commands = [lock]
