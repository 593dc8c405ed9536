"""``ftx configure``: a Triton model repository for a model, placed where you say (its weights stay in the
artifact store, which the repository's ``model_checkpoint_path`` points at)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from ftx_triton.cli.common import FtxCommand, get_host, say
from ftx_triton.cli.options import conversion_options, repository_options, safety_options
from ftx_triton.cli.run import run_pipeline, settings_from_options
from ftx_triton.errors import ConfigError, OutputError
from ftx_triton.paths import ftx_home
from ftx_triton.plan.settings import RunSettings


def check_output(output: Path) -> Path:
    """``--output`` must be absent or an empty directory."""
    output = output.expanduser().resolve()
    if output.exists():
        if not output.is_dir():
            raise OutputError(
                f"--output {output} exists and is not a directory", hint="choose a new directory (ftx creates it)"
            )
        if any(output.iterdir()):
            raise OutputError(
                f"--output {output} is not empty",
                hint="choose a new or empty directory; ftx never overwrites a repository",
            )
    return output


def precheck_source(settings: RunSettings, source: Path) -> None:
    """Family, data type, parallelism and tokenizer of a checkpoint directory, before converting it."""
    from ftx_triton.repository.model_config import check_data_type
    from ftx_triton.repository.writer import plan_tokenizer

    family, hf_config = get_host().family_for_source(source, settings.fetch.family)
    if settings.data_type != "auto":  # else the source's dtype, checked once the pipeline knows it
        check_data_type(family, settings.data_type)
    spec = family.spec(hf_config)
    spec.check_parallel(settings.convert.planned_tp, settings.configure.pp)
    tokenizer = settings.configure.tokenizer
    plan_tokenizer(tokenizer or source, family, spec, explicit=tokenizer is not None)


def fetched_source(settings: RunSettings) -> Path | None:
    """The checkpoint directory: a local one as is, anything else fetched into the store first."""
    local = Path(settings.fetch.source or settings.model).expanduser()
    if local.is_dir() and (local / "config.json").is_file():
        return local.resolve()
    result = run_pipeline(settings.replace(until="fetch"))
    return result.source.path if result.source is not None else None


def place_repository(repository: Path, output: Path) -> None:
    """Copy ``repository`` to ``output`` through a sibling temp directory and one rename."""
    from ftx_triton.io.atomic import publish_dir
    from ftx_triton.repository.writer import verify_repository
    from ftx_triton.store.artifact_store import PROVENANCE_FILE

    with publish_dir(output, lock_dir=ftx_home() / "locks") as tmp:
        for src in sorted(repository.rglob("*")):  # not copytree: it folds a full disk into one shutil.Error
            rel = src.relative_to(repository)
            if "__pycache__" in rel.parts or rel.as_posix() == PROVENANCE_FILE:
                continue
            if src.is_dir():
                (tmp / rel).mkdir(exist_ok=True)
            else:
                shutil.copy2(src, tmp / rel)
        tmp.chmod(0o755)
        verify_repository(tmp)


@click.command("configure", cls=FtxCommand)
@click.argument("source")
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(path_type=Path),
    help="Directory for the repository: must not exist or be empty. Written atomically.",
)
@click.option("--family", help="Model family (see `ftx models`); detected from config.json when omitted.")
@click.option("--revision", help="Branch, tag or commit of a Hugging Face source.")
@conversion_options
@repository_options
@safety_options
@click.option(
    "--runtime",
    default="fastertransformer",
    show_default=True,
    help="What serves the `fastertransformer` model: fastertransformer (the FasterTransformer backend), "
    "python (transformers on the converted files, same inputs and outputs), or a plugin's runtime.",
)
def configure(source: str, output: Path, runtime: str, **opts: Any) -> None:
    """Write a Triton model repository for SOURCE into --output.

    SOURCE is a preset (see `ftx models`), hf://org/name[@revision], a URL or a local checkpoint
    directory. The checkpoint is fetched and converted through the artifact store (cached under
    FTX_HOME); the repository holds `fastertransformer` (its model_checkpoint_path points at the
    converted <tp>-gpu directory in the store), `preprocessing` and `postprocessing` (the model's
    own tokenizer copied in, nothing downloaded at serve time), `text` (Triton's generate
    names: POST /v2/models/text/generate with {"text_input": "...", "max_tokens": 16}),
    `ensemble` (fastertransformer_backend's ensemble: INPUT_0 ... -> OUTPUT_0) and
    ftx-deployment.json (what it was built from).

    Bad options, a data type FasterTransformer does not run for the model, a checkpoint that
    does not match --tp and a missing tokenizer are reported before anything is written.
    """
    target = check_output(output)
    tokenizer = opts.get("tokenizer")
    if tokenizer is not None:
        opts["tokenizer"] = Path(tokenizer).expanduser().resolve()
    given = click.get_current_context().get_parameter_source("runtime") is not ParameterSource.DEFAULT
    settings = settings_from_options(
        source,
        until="configure",
        runtime=runtime,
        tune=False,
        untuned_because="ftx configure writes the repository without tuning (`ftx run` tunes on the GPU host)",
        runtime_origin=None if given else "ftx configure's default",
        **opts,
    )
    source_dir = fetched_source(settings)
    if source_dir is not None:
        precheck_source(settings, source_dir)
    result = run_pipeline(settings)
    if result.repository is None:
        raise ConfigError("the pipeline stopped before the configure stage", hint="run with -v to see why")
    place_repository(result.repository.path, target)
    say(f"repository {target}: {', '.join(result.repository.models)} (runtime {result.repository.runtime})")
    if settings.configure.streaming:
        from ftx_triton.repository.model_config import stream_of

        say(f"streaming  {stream_of(True, settings.configure.stream_interval).describe()} (--stream-interval)")
    if result.checkpoint is not None:
        say(f"checkpoint {result.checkpoint.path} (kept in the artifact store; the repository points at it)")
    click.echo(str(target))


commands = [configure]
