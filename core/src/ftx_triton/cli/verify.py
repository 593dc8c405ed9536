"""``ftx verify MODEL``: check a conversion against FasterTransformer's own math, on CPU.

MODEL is either what ``ftx convert`` takes (a preset, ``hf://…``, a checkpoint directory: it is
fetched and converted as ``ftx convert`` would, reusing the store) or a converted directory
(``<tp>-gpu`` with config.ini, or the ``--output`` of ``ftx convert`` holding such directories).
Each converted directory is run through :mod:`ftx_triton.oracle` and compared with transformers on the
original checkpoint: one PASS/FAIL line per directory on stdout; any FAIL exits 1.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from ftx_triton.cli.common import FtxCommand, get_host, say
from ftx_triton.cli.options import CPU_TORCH, conversion_options, safety_options
from ftx_triton.errors import CheckpointError, ConfigError, FtxError

MARKER = "ftx-convert.json"
"""What ``ftx convert`` leaves beside the files it places (its source and family)."""


def converted_dirs(path: Path) -> list[Path]:
    """The ``<tp>-gpu`` directories ``path`` is or holds; empty when it is no converted output."""
    if os.path.lexists(path / "config.ini"):  # whatever it is: a device or pipe is refused when it is read
        return [path]
    if not path.is_dir() or (path / "config.json").is_file():
        return []
    return sorted(p.parent for p in path.glob("*-gpu/config.ini"))


def _marker(directory: Path) -> dict[str, object]:
    try:
        data = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


Target = tuple[Path, Path, "str | None", "int | None"]
"""A converted directory, its original checkpoint, the transformers class and the tp (None: from the name)."""


def _original(directory: Path, checkpoint: Path | None) -> Target:
    """The checkpoint ``directory`` was converted from, and its transformers class when the family is known."""
    marker = _marker(directory)
    family = get_host().families.get(str(marker.get("family", "")))
    model_class = family.hf_model_class if family is not None and family.hf_model_class else None
    if checkpoint is not None:
        return directory, checkpoint, model_class, None
    source = marker.get("source")
    if isinstance(source, str) and source and (Path(source) / "config.json").is_file():
        return directory, Path(source), model_class, None
    raise ConfigError(
        f"{directory} does not say which checkpoint it was converted from, or that checkpoint is gone",
        hint="pass the original Hugging Face checkpoint with --checkpoint DIR, or verify by model "
        "name (ftx verify MODEL --tp N) so that ftx fetches and converts it",
    )


@click.command(cls=FtxCommand)
@click.argument("model")
@click.option(
    "--checkpoint",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The original Hugging Face checkpoint of a converted directory (default: the one ftx convert "
    "recorded beside it).",
)
@click.option("--family", help="Model family; detected from config.json when omitted.")
@click.option("--revision", help="Branch, tag or commit of a Hugging Face source.")
@conversion_options
@safety_options
def verify(
    model: str,
    checkpoint: Path | None,
    family: str | None,
    revision: str | None,
    tp: int,
    pp: int,
    weight_dtype: str,
    accept_license: bool,
    resource_check: bool,
) -> None:
    """Check that FasterTransformer would compute what transformers computes, without a GPU.

    A CPU reference of FasterTransformer's GPT, GPT-J, GPT-NeoX and T5 reads the converted files as
    FT's loaders do (names, config.ini dtype, per-rank shards) and its logits are compared with
    transformers' on the original checkpoint. Prints one PASS/FAIL line per converted directory with
    the largest logit difference; exits 1 on a FAIL.
    """
    from ftx_triton.oracle import verify as check

    _need_reference_packages()
    path = Path(model)
    directories = converted_dirs(path) if path.exists() else []
    if directories:
        targets = [_original(d, checkpoint) for d in directories]
    else:
        if checkpoint is not None:
            raise ConfigError(
                "--checkpoint goes with a converted directory, not with a model to convert",
                hint=f"ftx verify {model} fetches and converts the model itself; drop --checkpoint",
            )
        targets = [
            _convert(
                model,
                family=family,
                revision=revision,
                tp=tp,
                pp=pp,
                weight_dtype=weight_dtype,
                accept_license=accept_license,
                resource_check=resource_check,
            )
        ]
    failed = []
    for directory, original, model_class, split in targets:
        say(f"verifying {directory} against transformers on {original}")
        verdict = check(directory, original, model_class=model_class, tp=split)
        click.echo(verdict.describe())
        if not verdict.passed:
            failed.append(verdict)
    if any(verdict.non_finite for verdict in failed):
        raise CheckpointError(
            f"{sum(1 for v in failed if v.non_finite)} of {len(targets)} converted "
            f"director{'y' if len(targets) == 1 else 'ies'} hold NaN or Inf weights, which FasterTransformer "
            "would compute with (the files are named above)",
            hint="the original checkpoint holds them (check it, e.g. with torch.isfinite) or the conversion made "
            "them (an fp16 --weight-dtype overflowing: convert to fp32 or bf16); this is not the family's table",
        )
    if failed:
        raise CheckpointError(
            f"{len(failed)} of {len(targets)} converted director{'y' if len(targets) == 1 else 'ies'} would not compute "
            "what transformers computes on FasterTransformer",
            hint="the family's tensor table puts a tensor where FasterTransformer does not read it (q/k/v order, "
            "fused layout, split axis, a transpose): fix the table, re-convert, and verify again",
        )


def _need_reference_packages() -> None:
    """verify compares with transformers on torch: without them, an error saying how to install them (it was an
    ImportError traceback)."""
    from importlib.util import find_spec

    missing = [name for name in ("torch", "transformers") if find_spec(name) is None]
    if missing:
        raise ConfigError(
            f"ftx verify compares with transformers on the original checkpoint, which needs {' and '.join(missing)} "
            "(not installed here)",
            hint=f"{CPU_TORCH} && pip install 'ftx-triton[kit]' (the CPU build of torch first: the default one is "
            "the CUDA build, several GB)",
        )


def _convert(model: str, **options: object) -> Target:
    """Fetch and convert ``model`` as ``ftx convert`` does (the store's artifacts are reused)."""
    from ftx_triton.cli.run import run_pipeline, settings_from_options

    result = run_pipeline(settings_from_options(model, until="convert", runtime="auto", **options))
    if result.checkpoint is None or result.source is None or result.family is None:
        raise FtxError(f"{model} was not converted", hint="run ftx convert to see why")
    return (
        result.checkpoint.path,
        result.source.path,
        result.family.hf_model_class or None,
        result.checkpoint.tensor_parallel,
    )


commands = [verify]
