"""``ftx convert``: FasterTransformer files at a path of the user's choice, like the upstream scripts."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import click

from ftx.cli.common import FtxCommand, get_host, say
from ftx.cli.options import conversion_options
from ftx.cli.run import run_pipeline, settings_from_options
from ftx.convert import convert_directory
from ftx.errors import OutputError
from ftx.progress import byte_progress
from ftx.store import make_key

MARKER = "ftx-convert.json"


@click.command(cls=FtxCommand)
@click.argument("source")
@click.option("--family", help="Model family; detected from config.json when omitted.")
@click.option("--revision", help="Branch, tag or commit of a Hugging Face source.")
@conversion_options
@click.option("--output", "-o", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory that receives <tp>-gpu/ (config.ini + .bin files).")
@click.option("--overwrite", is_flag=True, help="Replace an existing <tp>-gpu directory.")
def convert(source: str, family: str | None, revision: str | None, tp: int, pp: int, weight_dtype: str,
            output: Path, overwrite: bool) -> None:
    """Convert SOURCE to FasterTransformer's layout in OUTPUT/<tp>-gpu/."""
    settings = settings_from_options(source, family=family, revision=revision, tp=tp, pp=pp,
                                     weight_dtype=weight_dtype, until="fetch")
    fetched = run_pipeline(settings)
    assert fetched.source is not None
    fam, hf_config = get_host().family_for_source(fetched.source.path, family)
    spec = fam.spec(hf_config)
    spec.check_parallel(tp, pp)
    fam.check_weight_dtype(weight_dtype)
    key = make_key({"source": fetched.source.revision, "family": fam.name, "fingerprint": fam.fingerprint(),
                    "tp": tp, "weight_dtype": weight_dtype})
    target = output / f"{tp}-gpu"
    if _up_to_date(target, key):
        say(f"{target} is already converted from this source; nothing to do")
        click.echo(str(target))
        return
    if target.exists() and any(target.iterdir()) and not overwrite:
        raise OutputError(f"{target} already exists and holds something else",
                          hint="choose another --output, or pass --overwrite to replace it")
    output.mkdir(parents=True, exist_ok=True)
    tmp = output / f".ftx-tmp-{uuid.uuid4().hex[:8]}"
    try:
        with byte_progress(f"convert {fam.name} tp={tp}") as update:
            result = convert_directory(fam, fetched.source.path, tmp, tp=tp, weight_dtype=weight_dtype,
                                       progress=update)
        (result.directory / MARKER).write_text(json.dumps({"key": key, "source": str(fetched.source.path),
                                                            "family": fam.name, "tp": tp, "weight_dtype": weight_dtype}))
        if target.exists():
            shutil.rmtree(target)
        os.replace(result.directory, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    say(f"wrote {len(result.files)} files ({result.bytes_written / 1e6:.1f} MB) in {result.seconds:.2f}s")
    click.echo(str(target))


def _up_to_date(target: Path, key: str) -> bool:
    marker = target / MARKER
    return marker.is_file() and json.loads(marker.read_text()).get("key") == key


commands = [convert]
