"""``ftx convert``: FasterTransformer files at a path of the user's choice, like the upstream scripts.

The conversion itself is the pipeline's convert stage (the same artifact ``ftx run --until convert``
builds and reuses); this command then places a copy of its ``<tp>-gpu`` directory at ``--output``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import click

from ftx_triton.cli.common import FtxCommand, command_store, say
from ftx_triton.cli.options import conversion_options, safety_options
from ftx_triton.cli.run import run_pipeline, settings_from_options
from ftx_triton.errors import OutputError
from ftx_triton.io.outputs import check_output_place
from ftx_triton.paths import ftx_home

MARKER = "ftx-convert.json"


@click.command(cls=FtxCommand)
@click.argument("source")
@click.option("--family", help="Model family; detected from config.json when omitted.")
@click.option("--revision", help="Branch, tag or commit of a Hugging Face source.")
@conversion_options
@click.option(
    "--output",
    "-o",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory that receives <tp>-gpu/ (config.ini + .bin files).",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing <tp>-gpu directory.")
@safety_options
def convert(
    source: str,
    family: str | None,
    revision: str | None,
    tp: int,
    pp: int,
    weight_dtype: str,
    output: Path,
    overwrite: bool,
    accept_license: bool,
    resource_check: bool,
) -> None:
    """Convert SOURCE to FasterTransformer's layout in OUTPUT/<tp>-gpu/."""
    from ftx_triton.formats.layout import gpu_dir_name
    from ftx_triton.terminal import timeline

    timeline.step("start")  # the interpreter, imports and option parsing
    check_output_place(output, "--output")
    target = output / gpu_dir_name(tp)
    if target.exists() and not target.is_dir():
        raise OutputError(f"{target} exists and is not a directory", hint="remove it or choose another --output")
    settings = settings_from_options(
        source,
        family=family,
        revision=revision,
        tp=tp,
        pp=pp,
        weight_dtype=weight_dtype,
        until="convert",
        runtime="auto",
        accept_license=accept_license,
        resource_check=resource_check,
    )
    result = run_pipeline(settings)
    checkpoint = result.checkpoint
    assert checkpoint is not None
    key = next(o.key for o in result.outcomes if o.stage == "convert")
    if _placed_from(target, key):
        damage = _damage(target, checkpoint.path)
        if damage is None:
            say(f"{target} is already converted from this source; nothing to do")
            click.echo(str(target))
            return
        say(f"{target} was converted from this source, but {damage}; placing it again")
        overwrite = True
    if target.exists() and any(target.iterdir()) and not overwrite:
        raise OutputError(
            f"{target} already exists and holds something else",
            hint="choose another --output, or pass --overwrite to replace it",
        )
    from ftx_triton.io.atomic import publish_dir

    with publish_dir(target, replace=overwrite, lock_dir=ftx_home() / "locks") as tmp:
        files = _place(checkpoint.path, tmp)
        (tmp / MARKER).write_text(
            json.dumps(
                {
                    "key": key,
                    "source": str(result.source.path if result.source else ""),
                    "family": checkpoint.family,
                    "tp": tp,
                    "weight_dtype": checkpoint.weight_dtype,
                }
            )
        )
    command_store().linked("convert", key)  # hard links moved the files' ctime, not their bytes
    say(f"placed {files} files from {checkpoint.path}")
    click.echo(str(target))


def _place(src: Path, dest: Path) -> int:
    """Hard-link (same filesystem) or copy every file of the converted checkpoint into ``dest``."""
    count = 0
    for file in sorted(p for p in src.iterdir() if p.is_file()):
        try:
            os.link(file, dest / file.name)
        except OSError:
            shutil.copy2(file, dest / file.name)
        count += 1
    return count


def _placed_from(target: Path, key: str) -> bool:
    """Whether ``target`` says it holds the conversion with ``key`` (its marker)."""
    marker = target / MARKER
    try:
        return json.loads(marker.read_text()).get("key") == key
    except (OSError, ValueError, AttributeError):
        return False


def _damage(target: Path, converted: Path) -> str | None:
    """What differs between a placed output and the store's (content-verified) conversion: a file missing,
    added, or of another size; None when every file is there as placed (a hard link to the store's, or a
    copy of its size)."""
    want = {p.name: p for p in converted.iterdir() if p.is_file()}
    have = {p.name: p for p in target.iterdir() if p.is_file() and p.name != MARKER}
    if missing := sorted(want.keys() - have.keys()):
        return f"{len(missing)} file(s) are missing ({', '.join(missing[:3])})"
    if extra := sorted(have.keys() - want.keys()):
        return f"it holds {len(extra)} file(s) the conversion does not ({', '.join(extra[:3])})"
    for name, placed in have.items():
        if not placed.samefile(want[name]) and placed.stat().st_size != want[name].stat().st_size:
            return f"{name} has another size"
    return None


commands = [convert]
